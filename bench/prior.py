"""The canvas's prior alone: the ground it draws where nobody has looked, against the world's.

    python -m bench.prior [--worlds 32] [--seconds 10] [--bank model/default/weights/ground_bank.npz]

Held-out worlds (``HELD_OUT_SEEDS[940:]``, no other bench uses them), each under a random
scene, each steered by ``mixed_policy`` from a random place. Beside the world, a session's
canvas (``model/default/reference/canvas/ground.py``, no compositor) starts from the ground under the first view,
as a served session does, and follows the same camera. Every second after the first, the
view is taken from both: the world's ground through the tokenizer (the codes of the true
map, decoded under the scene: the oracle ``tokens:1`` of ``bench.quality``) and the canvas's
reference (codes the prior drew, decoded tile by tile). Both go through the same decoder, so
what tells them apart is the prior's ground: which land covers it and how much, the seams
between its tiles, repetition. Printed, over all views:

- ``c2st_prior``: the two-sample test of ``bench.realism`` between the two (0.5: cannot be told
  apart), by world folds; ``c2st_control``: the world's against their 4x blur (the test sees);
- ``fd_prior``: the Frechet distance between their scene-net features
  (``bench/_scene_features.py``), beside ``fd_floor``: the world's views at the even seconds
  against those at the odd ones (two sets of the world's own ground);
- ``seam``: the mean step between neighbouring pixels across the canvas's tile edges over
  that inside tiles (1.0: edges do not show), and the same measure of the world's views at
  the same rows and columns (``seam_world``);
- ``built``: how much of the canvas's ground is built (roads, bridges, fields, roofs, lamps),
  beside ``built_world``, the world's: each code's chance of lying on built ground is counted
  on the world's own codes against its layout, then averaged over each side's codes (a prior
  that drops villages and roads reads below the world); likewise ``water`` beside
  ``water_world``, sea and lakes (a prior that, once on water, stays there reads above it).

Writes ``prior_<worlds>.png`` under ``--out`` (default runs/quality): per world the world's
ground through the tokenizer over the canvas, at 2, 5 and 10 s. A fast loop for the prior
(minutes on one thread): ``bench.quality --canvas`` measures the whole served model.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from worldserve.bench._realism_measures import blur4, c2st_accuracy, frechet_distance
from worldserve.bench._scene_features import load_scene_net, scene_features
from worldserve.bench.tokenizer import to_frames
from worldserve.model.default.reference.canvas.canvas import CODE_UNITS, MISSING, TILE_UNITS
from worldserve.model.default.reference.canvas.ground import VIEW_UNITS, GroundPainter
from worldserve.model.default.reference.canvas.quilt import BANK, GroundBank
from worldserve.model.default.reference.canvas.tile_decode import sharpen
from worldserve.model.default.reference.canvas.tokenizer import WEIGHTS, load_tokenizer
from worldserve.training.train import HELD_OUT_SEEDS
from worldserve.world import World
from worldserve.world.layers import BRIDGE, FIELD, LAMP, ROAD, ROOF
from worldserve.world.motion import expected_shift
from worldserve.world.policy import mixed_policy
from worldserve.world.scene import sample_scene
from worldserve.world.terrain import SEA_END

FIRST_WORLD = 940
BUCKET = 64
FPS = 24
STRIP_SECONDS = (2, 5, 10)
BUILT = (ROAD, BRIDGE, FIELD, ROOF, LAMP)  # the layout's materials people made


def tokens_view(painter: GroundPainter, ground: np.ndarray, scene: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The world's ground view (H, W, 3) uint8 through the tokenizer, decoded under ``scene``
    and sharpened as the canvas's tiles are (``tile_decode.sharpen``), and its codes (H/4, W/4)."""
    tok = painter.tokenizer
    x = torch.from_numpy(ground).permute(2, 0, 1)[None].float() / 127.5 - 1
    with torch.inference_mode():
        ids = tok.encode(x)
        img = sharpen(tok.decode(ids, torch.from_numpy(scene)[None])[0].float(), painter.decoder.sharpen)
        return to_frames(img[None])[0], ids[0].numpy()


def _view_cells(world: World, layer: np.ndarray, test: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """(16, 16): for each of the view's 4x4-unit cells (one code each), the share of its
    ``layer`` points (the layout's, ``density`` per unit) where ``test`` holds."""
    d, n = world.layout.density, layer.shape[0]
    top = np.floor((np.asarray(world.position) - BUCKET / 2) * d).astype(int)
    idx = [(top[i] + np.arange(BUCKET * d)) % n for i in range(2)]
    cell = CODE_UNITS * d
    hit = test(layer[np.ix_(idx[0], idx[1])])
    return hit.reshape(BUCKET // CODE_UNITS, cell, BUCKET // CODE_UNITS, cell).mean((1, 3))


def built_cells(world: World) -> np.ndarray:
    """(16, 16) bool: the view's cells of which a quarter or more is built ground (roads,
    bridges, fields, roofs, lamps), from the world's layout."""
    return _view_cells(world, world.layout.base.mat, lambda mat: np.isin(mat, BUILT)) >= 0.25


def water_cells(world: World) -> np.ndarray:
    """(16, 16) bool: the view's cells of which half or more is sea or lake (terrain below
    ``SEA_END``), from the world's layout."""
    return _view_cells(world, world.layout.terrain.levels, lambda levels: levels < SEA_END) >= 0.5


def cover_share(world_ids: np.ndarray, cover: np.ndarray, canvas_ids: np.ndarray, codes: int) -> tuple[float, float]:
    """The share of a land cover (``built_cells``, ``water_cells``) in the world's views and in
    the canvas's, both read through the codes: each code's chance of lying on that cover,
    counted on the world's own codes (``world_ids`` and ``cover`` (N, 16, 16)), averaged over
    each side's codes. Averaged over the world's own codes those chances give back the world's
    share itself."""
    hits = np.bincount(world_ids.ravel(), cover.ravel().astype(np.float64), codes)
    seen = np.bincount(world_ids.ravel(), minlength=codes)
    p = np.divide(hits, seen, out=np.zeros(codes), where=seen > 0)
    held = canvas_ids[canvas_ids != MISSING]
    return float(cover.mean()), float(p[held].mean())


def edge_ratio(frames: np.ndarray, rows: list[np.ndarray], cols: list[np.ndarray]) -> float:
    """The mean luminance step across the given pixel edges (per frame, the edge between
    pixel ``r - 1`` and ``r`` for each ``r`` in ``rows[i]``, likewise ``cols[i]``) over the
    mean step across all edges."""
    lum = frames.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    dy, dx = np.abs(np.diff(lum, axis=1)), np.abs(np.diff(lum, axis=2))  # (N, H-1, W), (N, H, W-1)
    at = [dy[i, r - 1].mean() for i, rr in enumerate(rows) for r in rr if 0 < r < lum.shape[1]]
    at += [dx[i, :, c - 1].mean() for i, cc in enumerate(cols) for c in cc if 0 < c < lum.shape[2]]
    return float(np.mean(at) / ((dy.mean() + dx.mean()) / 2)) if at else float("nan")


def tile_edges(top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The view's pixel rows and columns where a canvas tile begins (one pixel per unit)."""
    first = np.ceil(top / TILE_UNITS) * TILE_UNITS - top
    return (np.arange(first[0], BUCKET, TILE_UNITS).round().astype(int),
            np.arange(first[1], BUCKET, TILE_UNITS).round().astype(int))


def measure(painter: GroundPainter, worlds: int, seconds: int, seed: int) -> tuple[dict[str, float], np.ndarray]:
    rng = np.random.default_rng(seed)
    length = seconds * FPS + 1
    truth, canvas, groups, odd, rows, cols = [], [], [], [], [], []
    world_ids, built, water, canvas_ids = [], [], [], []
    strip = []
    for w_i, s in enumerate(HELD_OUT_SEEDS[FIRST_WORLD : FIRST_WORLD + worlds]):
        world = World(s, sample_scene(rng), (BUCKET,))
        world.reset(world.random_position(rng))
        look, vec = world.scene, world.scene.to_vector().astype(np.float32)
        g = painter.start(int(rng.integers(1 << 31)), look)
        painter.observe(g, world.render_ground(BUCKET))
        actions = mixed_policy(length, rng).astype(np.float32)
        shown: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for t in range(1, length):
            world.step(actions[t])
            shift = np.asarray(expected_shift(actions[t], BUCKET), np.float32)[None, None]
            ref = painter.references([g], shift, BUCKET)[0, 0, :3]
            painter.moved(g)
            if t % FPS == 0:
                view = to_frames(ref[None])[0]
                true, ids = tokens_view(painter, world.render_ground(BUCKET), vec)
                world_ids.append(ids)
                built.append(built_cells(world))
                water.append(water_cells(world))
                canvas_ids.append(g.canvas.crop(tuple(g.position), VIEW_UNITS))
                truth.append(true)
                canvas.append(view)
                groups.append(w_i)
                odd.append((t // FPS) % 2 == 1)
                r, c = tile_edges(g.position)
                rows.append(r)
                cols.append(c)
                shown[t // FPS] = (true, view)
        strip.append(np.concatenate([np.concatenate(shown[k], 0) for k in STRIP_SECONDS if k in shown], 1))
    a, b, grp, odd_ = np.stack(truth), np.stack(canvas), np.asarray(groups), np.asarray(odd)
    ids_w, ids_c = np.stack(world_ids), np.stack(canvas_ids)
    codes = painter.tokenizer.cfg.codes
    share_world, share = cover_share(ids_w, np.stack(built), ids_c, codes)
    wet_world, wet = cover_share(ids_w, np.stack(water), ids_c, codes)
    net = load_scene_net()
    fa, fb = scene_features(net, a), scene_features(net, b)
    res = {
        "c2st_prior": c2st_accuracy(a, b, grp, grp),
        "c2st_control": c2st_accuracy(a, blur4(a), grp, grp),
        "fd_prior": frechet_distance(fa, fb),
        "fd_floor": frechet_distance(fa[odd_], fa[~odd_]),
        "seam": edge_ratio(b, rows, cols),
        "seam_world": edge_ratio(a, rows, cols),
        "built": share,
        "built_world": share_world,
        "water": wet,
        "water_world": wet_world,
        "views": float(len(a)),
    }
    return res, np.concatenate(strip, 0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, default=32)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bank", type=Path, default=BANK, help="the prior's bank of code maps")
    ap.add_argument("--tokenizer", type=Path, default=WEIGHTS, help="the tokenizer (no suffix)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/quality"))
    args = ap.parse_args(argv)
    if args.worlds < 4 or FIRST_WORLD + args.worlds > len(HELD_OUT_SEEDS) or args.seconds < 2:
        ap.error(f"--worlds must be 4 ... {len(HELD_OUT_SEEDS) - FIRST_WORLD}, --seconds >= 2")
    torch.set_num_threads(args.threads)
    painter = GroundPainter(load_tokenizer(args.tokenizer), GroundBank.load(args.bank),
                            torch.device("cpu"), ahead=False)
    t0 = time.perf_counter()
    res, strip = measure(painter, args.worlds, args.seconds, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"prior_{args.worlds}.png"
    n = min(8, args.worlds)
    img = strip[: n * 2 * BUCKET]
    Image.fromarray(img).resize((img.shape[1] * 2, img.shape[0] * 2), Image.NEAREST).save(path)
    print(f"strip (per world: the world's ground through the tokenizer over the canvas, at {STRIP_SECONDS} s): {path}")
    print(f"{math.ceil(time.perf_counter() - t0)} s")
    print("prior " + " ".join(f"{k}={v:.3f}" for k, v in res.items()))


if __name__ == "__main__":
    main()
