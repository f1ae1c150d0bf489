"""The feature space of ``bench.realism``'s Frechet distance: a small network trained on the
renderer's frames alone to name their scene attributes (biome, vegetation, time, weather,
season: ``world/scene.py``).

Its features (the 64 units before the attribute heads) describe what a frame shows in the
terms the world is made of: a model frame that the network cannot place among the world's
scenes lies far from the renderer's frames there. Trained once on worlds the bench never
measures (training seeds, ``TRAIN_SEEDS``: not ``HELD_OUT_SEEDS``) and cached in
``DEFAULT_PATH`` with its recipe and held-out accuracy per attribute in a JSON beside it;
``load_scene_net`` trains and writes it when the file is missing. Frames of another size
than ``SIZE`` are area-resized to it first.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from worldserve.bench._realism_measures import FrameClassifier, to_input
from worldserve.world import World, sample_scene
from worldserve.world.scene import ATTRIBUTES, SceneAttrs

DEFAULT_PATH = Path(__file__).parent / "data" / "scene_features.safetensors"
SIZE = 64  # the frame side the network reads
TRAIN_SEEDS = range(100_000, 100_100)  # outside HELD_OUT_SEEDS (0..999): the bench never measures these
FEATURES = 64
HEADS = tuple(ATTRIBUTES)  # one head per attribute, in the vector order


@dataclass(frozen=True)
class SceneNetRecipe:
    worlds: int = 48  # TRAIN_SEEDS[:worlds]; the last ``val_worlds`` of them held out
    val_worlds: int = 4
    scenes_per_world: int = 8
    views_per_scene: int = 12  # random places, each after 0..23 frames of the world's own motion
    widths: tuple[int, ...] = (16, 32, 64, 64)
    epochs: int = 36  # with each batch flipped at random (a scene has no handedness)
    batch: int = 32
    lr: float = 2e-3
    seed: int = 0


class SceneNet(nn.Module):
    """A ``FrameClassifier`` body with ``FEATURES`` outputs, ReLU, then one linear head per
    scene attribute (logits over its values)."""

    def __init__(self, widths: tuple[int, ...]):
        super().__init__()
        self.trunk = FrameClassifier(widths, FEATURES)
        self.heads = nn.ModuleDict({a: nn.Linear(FEATURES, len(ATTRIBUTES[a])) for a in HEADS})

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.trunk(x))  # (N, FEATURES)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        f = self.features(x)
        return {a: head(f) for a, head in self.heads.items()}


def labels(scene: SceneAttrs) -> list[int]:
    """The index of each attribute's value, in ``HEADS`` order."""
    return [ATTRIBUTES[a].index(getattr(scene, a)) for a in HEADS]


def render_views(recipe: SceneNetRecipe, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Renderer frames of ``recipe.worlds`` training worlds: (frames (N, SIZE, SIZE, 3) uint8,
    labels (N, len(HEADS)), world index (N,))."""
    frames, labs, groups = [], [], []
    still = np.zeros(6, np.float32)
    for i, seed in enumerate(TRAIN_SEEDS[: recipe.worlds]):
        world = World(seed, sample_scene(rng), (SIZE,))
        for _ in range(recipe.scenes_per_world):
            scene = sample_scene(rng)
            world.set_scene(scene)
            for _ in range(recipe.views_per_scene):
                world.reset(world.random_position(rng))
                for _ in range(int(rng.integers(0, 24))):
                    world.step(still)
                frames.append(world.render(SIZE))
                labs.append(labels(scene))
                groups.append(i)
    return np.stack(frames), np.asarray(labs), np.asarray(groups)


def train_scene_net(recipe: SceneNetRecipe = SceneNetRecipe(), log: bool = True) -> tuple[SceneNet, dict[str, float]]:
    """Train on the renderer's frames; returns the network (eval mode) and its accuracy per
    attribute on the held-out worlds."""
    t0 = time.perf_counter()
    frames, labs, groups = render_views(recipe, np.random.default_rng(recipe.seed))
    val = groups >= recipe.worlds - recipe.val_worlds
    x, y = to_input(frames), torch.from_numpy(labs)
    held_out = torch.from_numpy(val)
    x_tr, y_tr, x_val, y_val = x[~held_out], y[~held_out], x[held_out], y[held_out]
    if log:
        print(f"scene net: {len(x_tr)} training frames, {len(x_val)} held out, "
              f"rendered in {time.perf_counter() - t0:.0f} s")
    torch.manual_seed(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    net = SceneNet(recipe.widths)
    opt = torch.optim.Adam(net.parameters(), lr=recipe.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, recipe.epochs * -(-len(x_tr) // recipe.batch))
    for epoch in range(recipe.epochs):
        net.train()
        order = torch.randperm(len(x_tr), generator=gen)
        total = 0.0
        for s in range(0, len(order), recipe.batch):
            idx = order[s : s + recipe.batch]
            xb = x_tr[idx]
            if torch.rand((), generator=gen) < 0.5:
                xb = xb.flip(3)
            if torch.rand((), generator=gen) < 0.5:
                xb = xb.flip(2)
            out = net(xb)
            loss = sum(F.cross_entropy(out[a], y_tr[idx, k]) for k, a in enumerate(HEADS))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        if log:
            print(f"  epoch {epoch + 1}/{recipe.epochs}: loss {total / len(x_tr):.3f} "
                  f"({time.perf_counter() - t0:.0f} s)")
    net.eval()
    with torch.no_grad():
        out = net(x_val)
    acc = {a: float((out[a].argmax(1) == y_val[:, k]).float().mean()) for k, a in enumerate(HEADS)}
    return net, acc


def load_scene_net(path: Path = DEFAULT_PATH, train_if_missing: bool = True) -> SceneNet:
    """The cached network at ``path`` (``path.with_suffix('.json')``: its recipe and held-out
    accuracy); trained and written there first when missing and ``train_if_missing``."""
    meta = path.with_suffix(".json")
    if not path.exists():
        if not train_if_missing:
            raise FileNotFoundError(f"no scene-feature network at {path}")
        recipe = SceneNetRecipe()
        net, acc = train_scene_net(recipe)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
        held = {a: round(v, 3) for a, v in acc.items()}
        meta.write_text(json.dumps({"recipe": asdict(recipe), "heldout_accuracy": held}, indent=1) + "\n")
        print(f"scene net written to {path}; held-out accuracy " + " ".join(f"{a}={v:.3f}" for a, v in acc.items()))
        return net
    recipe = SceneNetRecipe(**{k: tuple(v) if isinstance(v, list) else v
                               for k, v in json.loads(meta.read_text())["recipe"].items()})
    net = SceneNet(recipe.widths)
    net.load_state_dict(load_file(str(path)))
    return net.eval()


def scene_features(net: SceneNet, frames: np.ndarray) -> np.ndarray:
    """(N, H, W, 3) uint8 -> (N, FEATURES) float64."""
    x = to_input(frames)
    if x.shape[-1] != SIZE:
        x = F.interpolate(x, size=(SIZE, SIZE), mode="area")
    with torch.no_grad():
        return torch.cat([net.features(x[s : s + 512]) for s in range(0, len(x), 512)]).double().numpy()
