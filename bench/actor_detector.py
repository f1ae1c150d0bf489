"""A small detector of the world's moving things (animals and boats) in 64 px frames: the eyes
of ``bench.realism_motion``'s actor statistics. Bench only: serving never imports it.

    python -m bench.actor_detector train     [--worlds N] [--epochs N]   (writes DEFAULT_PATH)
    python -m bench.actor_detector validate  [--worlds N]                (precision, recall per kind)

A fully convolutional network reads a frame at full resolution and writes one heatmap per
actor kind (``world.actors``: ANIMAL, BOAT); its target is a small Gaussian (sigma 1.5 px) at
each actor's anchor pixel, the pixel ``world.sprites.draw_actors`` centres the sprite on
(cross-entropy, the target's mass weighted ``pos_weight`` times more). A
third channel says which pixels are water (the world's water class under each pixel), so a
view's water share is read from any frame, the world's or a model's (``water_share``).
Labels come from the world's own actor state, frames from worlds of training seeds
(``TRAIN_SEEDS``: inside training's pool, outside every held-out range), each under a random
scene, at random places (half of them next to an actor, so both kinds are seen often), after
0-47 frames of the world's own motion under random keys and mouse. A detection is a local
maximum (``PEAK`` px around) of a kind's heatmap above the kind's threshold (the one of
``THRESHOLDS`` with the best F1 on ``TUNE_SEEDS``, training-pool worlds it did not train on);
it matches an actor of its kind within ``MATCH_PX``.

``validate`` counts on ``VAL_SEEDS`` (held-out worlds the other benches leave alone): precision
(detections that are actors) and recall (actors found) per kind, for actors whose anchor lies
in the view. Weights and their recipe and validation figures: ``bench/data/actor_detector.*``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from worldserve.world import VIEW, World, sample_scene
from worldserve.world.actors import ANIMAL, BOAT
from worldserve.world.render import nearest
from worldserve.world.start import START_MAP_SIZE

DEFAULT_PATH = Path(__file__).parent / "data" / "actor_detector.safetensors"
BUCKET = 64  # the frame side the detector reads (1 px per world unit)
KINDS = (ANIMAL, BOAT)  # heatmap channel -> actor kind
KIND_NAMES = ("animal", "boat")
TRAIN_SEEDS = range(500_000, 500_200)  # inside training's world pool (training.data: 10_000 + ...)
TUNE_SEEDS = range(500_200, 500_208)  # training-pool worlds the detector did not train on: its thresholds
# HELD_OUT_SEEDS[984:1000] (training.train's held-out 0 ... 999, not imported: it loads the model);
# no other bench measures these
VAL_SEEDS = tuple(range(984, 1000))
THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(2, 13))  # per kind, the one of best F1 on TUNE_SEEDS is kept
PEAK = 2  # px: a detection is the maximum of its (2 PEAK + 1)^2 neighbourhood (a herd's animals stand 3-5 px apart)
MATCH_PX = 2.5  # px: a detection within this of an actor of its kind found it


@dataclass(frozen=True)
class DetectorRecipe:
    worlds: int = 64  # TRAIN_SEEDS[:worlds]
    views_per_world: int = 48
    width: int = 48  # channels of every hidden layer
    dilations: tuple[int, ...] = (1, 1, 2, 4, 1)  # one 3x3 conv each: a receptive field of 19 px
    epochs: int = 36
    batch: int = 32
    crop: int = 32  # training crops (px); the detector reads whole frames
    lr: float = 3e-3  # Adam, cosine decay to 0
    pos_weight: tuple[float, ...] = (30.0, 10.0)  # per kind, loss weight on the target's mass (actors are a
    # few pixels of 4096; an animal's two to six)
    sigma: float = 1.0  # px: the target's Gaussian at each anchor
    seed: int = 0


class ActorNet(nn.Module):
    """(N, 3, H, W) in [-1, 1] -> (N, len(KINDS) + 1, H, W) logits (each kind's heatmap, then
    water): 3x3 convolutions at full resolution (``dilations``), ReLU between, a 1x1 head."""

    def __init__(self, width: int, dilations: tuple[int, ...]):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for d in dilations:
            layers += [nn.Conv2d(c_in, width, 3, padding=d, dilation=d), nn.ReLU()]
            c_in = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Conv2d(width, len(KINDS) + 1, 1)
        self.register_buffer("thresholds", torch.full((len(KINDS),), 0.5))  # per kind (``tune``)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def anchors_in_view(world: World, bucket: int = BUCKET) -> tuple[np.ndarray, np.ndarray]:
    """The actors whose anchor pixel lies in the current view: ((M, 2) int (row, col), (M,) kind),
    the pixel ``draw_actors`` centres each sprite on."""
    st = world.state
    ppu = bucket / VIEW
    top = np.array(st.position) - VIEW / 2
    rel = (st.actors.pos - top) % world.map_size
    rel = np.where(rel > world.map_size - VIEW, rel - world.map_size, rel)
    px = np.rint(rel * ppu - 0.5).astype(np.int64)
    inside = (px >= 0).all(1) & (px < bucket).all(1)
    return px[inside], st.actors.kind[inside]


def water_in_view(world: World, water: np.ndarray, bucket: int = BUCKET) -> np.ndarray:
    """(bucket, bucket) bool: the world's water under each pixel of the current view, ``water``
    being ``nearest(world.layout.terrain.water, map_size * bucket // VIEW)`` (as ``render`` reads it)."""
    ppu = bucket / VIEW
    top = (np.array(world.position) - VIEW / 2) * ppu
    rows = (int(np.floor(top[0] + 0.5)) + np.arange(bucket)) % water.shape[0]
    cols = (int(np.floor(top[1] + 0.5)) + np.arange(bucket)) % water.shape[1]
    return water[np.ix_(rows, cols)] > 0


def heat_target(px: np.ndarray, kind: np.ndarray, bucket: int = BUCKET, sigma: float = 1.0) -> np.ndarray:
    """(len(KINDS), bucket, bucket) float32: a Gaussian bump of peak 1 at each actor's anchor."""
    yy, xx = np.mgrid[:bucket, :bucket]
    out = np.zeros((len(KINDS), bucket, bucket), np.float32)
    for (y, x), k in zip(px, kind, strict=True):
        bump = np.exp(-((yy - y) ** 2 + (xx - x) ** 2) / (2 * sigma**2)).astype(np.float32)
        c = KINDS.index(int(k))
        np.maximum(out[c], bump, out=out[c])
    return out


def sample_views(seeds: range | tuple[int, ...], views: int, rng: np.random.Generator
                 ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Frames (N, 64, 64, 3) of the worlds of ``seeds`` under random scenes, their actors in
    view (``anchors_in_view``) and their water (N, 64, 64) bool, ``views`` each (module docstring)."""
    frames, labels, waters = [], [], []
    for seed in seeds:
        world = World(int(seed), sample_scene(rng), (BUCKET,), map_size=START_MAP_SIZE)
        water = nearest(world.layout.terrain.water, START_MAP_SIZE * BUCKET // VIEW)
        for v in range(views):
            if v % 8 == 0:
                world.set_scene(sample_scene(rng))
            acts = world.state.actors
            if v % 2 == 0 and len(acts):
                near = acts.pos[int(rng.integers(len(acts)))] + rng.uniform(-24, 24, 2)
                world.reset(near)
            else:
                world.reset(world.random_position(rng, max_water=1.0, max_rock=1.0))
            action = np.zeros(6, np.float32)
            for _ in range(int(rng.integers(0, 48))):
                if rng.random() < 0.1:
                    action = np.concatenate([(rng.random(4) < 0.2).astype(np.float32),
                                             rng.uniform(-1, 1, 2).astype(np.float32) * (rng.random() < 0.5)])
                world.step(action)
            frames.append(world.render(BUCKET))
            labels.append(anchors_in_view(world))
            waters.append(water_in_view(world, water))
    return np.stack(frames), labels, np.stack(waters)


def to_input(frames: np.ndarray) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 127.5 - 1


def train(recipe: DetectorRecipe, log: bool = True) -> tuple[ActorNet, dict[str, float]]:
    rng = np.random.default_rng(recipe.seed)
    t0 = time.perf_counter()
    frames, labels, waters = sample_views(TRAIN_SEEDS[: recipe.worlds], recipe.views_per_world, rng)
    x = to_input(frames)
    heat = np.stack([heat_target(p, k, sigma=recipe.sigma) for p, k in labels])
    y = torch.from_numpy(np.concatenate([heat, waters[:, None].astype(np.float32)], 1))
    if log:
        n = sum(len(k) for _, k in labels)
        print(f"{len(x)} training frames, {n} actors in view, {time.perf_counter() - t0:.0f} s", flush=True)
    torch.manual_seed(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    net = ActorNet(recipe.width, recipe.dilations)
    opt = torch.optim.Adam(net.parameters(), lr=recipe.lr)
    steps = recipe.epochs * -(-len(x) // recipe.batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for epoch in range(recipe.epochs):
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for s in range(0, len(order), recipe.batch):
            idx = order[s : s + recipe.batch]
            c = recipe.crop
            oy, ox = (int(v) for v in torch.randint(0, BUCKET - c + 1, (2,), generator=gen))
            xb, yb = x[idx, :, oy : oy + c, ox : ox + c], y[idx, :, oy : oy + c, ox : ox + c]
            flips = [d for d in (2, 3) if bool(torch.rand((), generator=gen) < 0.5)]
            if flips:  # seen from above, the world has no handedness
                xb, yb = xb.flip(flips), yb.flip(flips)
            logits = net(xb)
            weight = 1 + torch.tensor(recipe.pos_weight).view(1, -1, 1, 1) * yb[:, : len(KINDS)]
            loss = F.binary_cross_entropy_with_logits(logits[:, : len(KINDS)], yb[:, : len(KINDS)], weight=weight)
            loss = loss + F.binary_cross_entropy_with_logits(logits[:, -1], yb[:, -1])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        if log:
            print(f"epoch {epoch + 1}/{recipe.epochs} loss {total / len(x):.4f} "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    return net.eval(), {"train_frames": float(len(x)), "train_s": time.perf_counter() - t0}


@torch.no_grad()
def heatmaps(net: ActorNet, frames: np.ndarray, batch: int = 256) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, len(KINDS) + 1, H, W) probabilities (each kind, then water)."""
    out = [torch.sigmoid(net(to_input(frames[s : s + batch]))) for s in range(0, len(frames), batch)]
    return torch.cat(out) if out else torch.zeros(0, len(KINDS) + 1, *frames.shape[1:3])


def peaks(heat: torch.Tensor, thresholds: torch.Tensor, peak: int = PEAK) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per frame, its detections: ((M, 2) int (row, col), (M,) kind) from ``heatmaps``, each
    kind's peaks above its entry of ``thresholds``."""
    k = 2 * peak + 1
    heat = heat[:, : len(KINDS)]
    local = F.max_pool2d(heat, k, 1, peak)
    hit = (heat >= local) & (heat > thresholds.view(1, -1, 1, 1))  # (N, K, H, W)
    out = []
    for i in range(heat.shape[0]):
        c, yy, xx = torch.nonzero(hit[i], as_tuple=True)
        out.append((torch.stack([yy, xx], 1).numpy().astype(np.int64),
                    np.asarray(KINDS, np.int64)[c.numpy()]))
    return out


def detect(net: ActorNet, frames: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per frame of (N, H, W, 3) uint8: its actors, ((M, 2) int (row, col), (M,) kind)."""
    return peaks(heatmaps(net, frames), net.thresholds)


def detect_all(net: ActorNet, frames: np.ndarray) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """``detect`` and each frame's water share (N,), from one pass."""
    heat = heatmaps(net, frames)
    return peaks(heat, net.thresholds), (heat[:, -1] > 0.5).float().mean((1, 2)).numpy()


def tune(net: ActorNet, views: int = 48, seed: int = 2) -> dict[str, float]:
    """Set each kind's threshold (of ``THRESHOLDS``) to the one of best F1 on ``TUNE_SEEDS``."""
    frames, labels, _ = sample_views(TUNE_SEEDS, views, np.random.default_rng(seed))
    heat = heatmaps(net, frames)
    best = {}
    for c, name in enumerate(KIND_NAMES):
        scores = []
        for thr in THRESHOLDS:
            found = peaks(heat, torch.full((len(KINDS),), thr))
            tp, nd, nt = sum(match_counts(f, t)[c] for f, t in zip(found, labels, strict=True))
            scores.append(2 * tp / max(nd + nt, 1))
        net.thresholds[c] = THRESHOLDS[int(np.argmax(scores))]
        best[f"{name}_threshold"] = float(net.thresholds[c])
    return best


def match_counts(found: tuple[np.ndarray, np.ndarray], truth: tuple[np.ndarray, np.ndarray],
                 radius: float = MATCH_PX) -> np.ndarray:
    """(len(KINDS), 3) counts per kind: true positives, detections, actors; one actor matches at
    most one detection (greedy, nearest first)."""
    out = np.zeros((len(KINDS), 3), np.int64)
    for c, kind in enumerate(KINDS):
        d = found[0][found[1] == kind].astype(np.float64)
        t = truth[0][truth[1] == kind].astype(np.float64)
        out[c, 1:] = len(d), len(t)
        if not len(d) or not len(t):
            continue
        dist = np.linalg.norm(d[:, None] - t[None], axis=-1)
        pairs = sorted((float(dist[i, j]), i, j) for i, j in zip(*np.nonzero(dist <= radius), strict=True))
        used_d, used_t = set(), set()
        for _, i, j in pairs:
            if i not in used_d and j not in used_t:
                used_d.add(i)
                used_t.add(j)
        out[c, 0] = len(used_d)
    return out


def validate(net: ActorNet, worlds: int = len(VAL_SEEDS), views: int = 48, seed: int = 1) -> dict[str, float]:
    """Precision and recall per kind on held-out worlds (``VAL_SEEDS``)."""
    frames, labels, waters = sample_views(VAL_SEEDS[:worlds], views, np.random.default_rng(seed))
    found, share = detect_all(net, frames)
    tot = sum((match_counts(f, t) for f, t in zip(found, labels, strict=True)), np.zeros((len(KINDS), 3), np.int64))
    res: dict[str, float] = {"val_frames": float(len(frames))}
    for c, name in enumerate(KIND_NAMES):
        tp, nd, nt = (int(v) for v in tot[c])
        res[f"{name}_precision"] = tp / max(nd, 1)
        res[f"{name}_recall"] = tp / max(nt, 1)
        res[f"{name}_actors"] = float(nt)
    res["water_share_error"] = float(np.abs(share - waters.mean((1, 2))).mean())  # mean |read - true| per view
    return res


def load_detector(path: Path = DEFAULT_PATH) -> ActorNet:
    meta = json.loads(path.with_suffix(".json").read_text())
    recipe = meta["recipe"]
    net = ActorNet(recipe["width"], tuple(recipe["dilations"]))
    net.load_state_dict(load_file(str(path)))
    return net.eval()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train or validate the bench's actor detector.")
    ap.add_argument("command", choices=("train", "validate"))
    ap.add_argument("--out", type=Path, default=DEFAULT_PATH)
    ap.add_argument("--worlds", type=int, default=None, help="training worlds (train) or held-out worlds (validate)")
    ap.add_argument("--epochs", type=int, default=DetectorRecipe.epochs)
    ap.add_argument("--width", type=int, default=DetectorRecipe.width)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.command == "train":
        recipe = DetectorRecipe(worlds=args.worlds or DetectorRecipe.worlds, epochs=args.epochs, width=args.width)
        net, info = train(recipe)
        info.update(tune(net))
        val = validate(net)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(args.out))
        meta = {"recipe": asdict(recipe), "match_px": MATCH_PX, **info, "validation": val}
        args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        print(json.dumps(val))
    else:
        val = validate(load_detector(args.out), args.worlds or len(VAL_SEEDS))
        print(" ".join(f"{k}={v:.3f}" for k, v in val.items()))


if __name__ == "__main__":
    main()
