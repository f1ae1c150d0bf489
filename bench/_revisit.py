"""Does a place look the same when the camera comes back to it? ``bench.quality``'s revisit.

Each held-out world is steered for ``LEAD_FRAMES`` (``mixed_policy``), then driven
``AWAY_FRAMES`` (3 s) in one direction and back along the same path (the same actions in
reverse order, each one undone), so the camera ends exactly where it left. The view at the
return is compared with the view shown there before: ``revisit_psnr`` for the model's own
frames, ``revisit_psnr_world`` for the renderer's (below a perfect score only by what moves on
its own: animals, boats, water, clouds, weather). A model that keeps the place scores near the
renderer; one that forgets what left the view and draws new ground there scores far below it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from worldserve.bench._driver import Driver, make_worlds
from worldserve.bench._frame_measures import pooled_psnr
from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import ACTION_DIM, KEYS
from worldserve.world import mixed_policy

LEAD_FRAMES = 48  # 2 s of steering before the place to come back to
AWAY_FRAMES = 72  # 3 s away, then 3 s back: 144 world units at a held key, over two view widths
FIRST_WORLD = 440  # HELD_OUT_SEEDS[440:]: after the other parts' 0 ... 423, before bench.realism's 500
_SWAP = [KEYS.index(k) for k in ("back", "forward", "right", "left")]  # each key's opposite


def undo(actions: np.ndarray) -> np.ndarray:
    """The path back: ``actions`` (T, A) in reverse order, each one's camera motion undone
    (forward and back swapped, left and right swapped, the mouse negated)."""
    back = actions[::-1].copy()
    back[:, : len(KEYS)] = back[:, _SWAP]
    back[:, len(KEYS) :] *= -1
    return back


def away_script(rng: np.random.Generator) -> np.ndarray:
    """``AWAY_FRAMES`` of one or two held keys (one of eight directions) with a slow random
    mouse drift, (AWAY_FRAMES, A)."""
    act = np.zeros((AWAY_FRAMES, ACTION_DIM), np.float32)
    dirs = [("forward",), ("back",), ("left",), ("right",), ("forward", "left"), ("forward", "right"),
            ("back", "left"), ("back", "right")]
    for k in dirs[int(rng.integers(len(dirs)))]:
        act[:, KEYS.index(k)] = 1.0
    act[:, len(KEYS) :] = np.clip(np.cumsum(rng.normal(0, 0.05, (AWAY_FRAMES, 2)), 0), -0.5, 0.5)
    return act


@dataclass
class Revisit:
    left: np.ndarray  # (E, 2, H, W, 3) the view where the camera left it: renderer, model
    back: np.ndarray  # (E, 2, H, W, 3) the view at the same place on its return: renderer, model


def revisit(runner: ModelRunner, bucket: int, episodes: int, rng: np.random.Generator) -> Revisit:
    """Renderer and model through the lead, away and back (module docstring)."""
    worlds = make_worlds(episodes, bucket, rng, FIRST_WORLD)
    scripts = []
    for _ in worlds:
        away = away_script(rng)
        scripts.append(np.concatenate((mixed_policy(LEAD_FRAMES + 1, rng).astype(np.float32), away, undo(away))))
    actions = np.stack(scripts)  # (E, T, A); action 0 is never taken (frame 0 is the observation)
    leave, ret = LEAD_FRAMES, LEAD_FRAMES + 2 * AWAY_FRAMES
    drv = Driver(runner, bucket)
    drv.open(np.stack([w.render(bucket) for w in worlds]), [w.scene.to_prompt() for w in worlds], seed=13)
    shape = (episodes, 2, bucket, bucket, 3)
    left, back = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
    for t in range(1, ret + 1):
        frames = drv.step(actions[:, t])
        for i, w in enumerate(worlds):
            w.step(actions[i, t])
            if t in (leave, ret):
                (left if t == leave else back)[i] = (w.render(bucket), frames[i])
    drv.close()
    return Revisit(left, back)


def save_revisit_strip(rv: Revisit, out: Path, bucket: int, n: int = 8) -> Path:
    """Per episode (a row each): renderer at departure, at return; model at departure, at
    return (``revisit_<bucket>.png``)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [np.concatenate([rv.left[i, 0], rv.back[i, 0], rv.left[i, 1], rv.back[i, 1]], 1)
            for i in range(min(n, rv.left.shape[0]))]
    img = np.concatenate(rows, 0)
    scale = max(1, 128 // bucket)
    path = out / f"revisit_{bucket}.png"
    Image.fromarray(img).resize((img.shape[1] * scale, img.shape[0] * scale), Image.NEAREST).save(path)
    return path


def revisit_line(label: str, runner: ModelRunner, bucket: int, episodes: int, seed: int, out: Path) -> str:
    """``label revisit_psnr=.. revisit_psnr_world=..`` for another runner on the script
    ``bench.quality`` gives the weights (its strip under ``out / label``)."""
    rv = revisit(runner, bucket, episodes, np.random.default_rng([seed, bucket, 3]))
    save_revisit_strip(rv, out / label, bucket)
    return (f"{label} revisit_psnr={pooled_psnr(rv.back[:, 1], rv.left[:, 1]):.2f} "
            f"revisit_psnr_world={pooled_psnr(rv.back[:, 0], rv.left[:, 0]):.2f}")
