"""The ground tokenizer against the world's ground, on held-out worlds (the design's step 2).

    python -m bench.tokenizer [--weights model/default/weights/tokenizer] [--worlds 16] [--out DIR]

Static views of the ground alone (``World.render_ground``) of held-out worlds
(``HELD_OUT_SEEDS[920:]``, no other bench uses them), each world under a random scene, 24
views at random places. Printed:

- ``psnr``: the views encoded and decoded under their scene; ``psnr_reskin``: encoded under
  the scene, decoded under another of the same biome, vegetation and weather, against the
  view under that one (a prompt switch re-skinning the same codes);
- beside them what flat blocks earn: ``psnr_blocks4`` (4x4-pixel block means, one colour per
  code) and ``psnr_blocks16`` (16x16, a token of the default model drawn as one colour);
- ``c2st``: the two-sample test of ``bench.realism`` between the views and their
  reconstructions (0.5: cannot be told apart), with its blur control ``c2st_control``;
- ``codes_used``: distinct codes over all views.

The stage's goal: psnr >= 30 and c2st <= 0.65 (``docs/training.md``). Writes
``tokenizer_<worlds>.png`` under ``--out`` (default runs/quality): per world a view, its
reconstruction and its re-skin.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from worldserve.bench._frame_measures import pooled_psnr
from worldserve.bench._realism_measures import blocky, blur4, c2st_accuracy
from worldserve.model.default.reference.canvas.tokenizer import load_tokenizer
from worldserve.training.tokenizer import (
    BUCKET,
    COMMITTED,
    PairedWorld,
    relit,
    scene_vector,
    to_input,
)
from worldserve.training.train import HELD_OUT_SEEDS

FIRST_WORLD = 920
VIEWS = 24


def to_frames(x: torch.Tensor) -> np.ndarray:
    """(N, 3, H, W) in [-1, 1] -> (N, H, W, 3) uint8."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def measure(weights: Path, worlds: int, seed: int) -> tuple[dict[str, float], np.ndarray]:
    """The figures (module docstring) and a strip image."""
    model = load_tokenizer(weights)
    rng = np.random.default_rng(seed)
    real, rec, skin_real, skin_rec, rows = [], [], [], [], []
    used: set[int] = set()
    for s in HELD_OUT_SEEDS[FIRST_WORLD : FIRST_WORLD + worlds]:
        pw = PairedWorld(s, rng, 1024)
        pw.b.set_scene(relit(pw.a.scene, rng))
        a, b = pw.views(VIEWS, rng)
        with torch.no_grad():
            ids = model.encode(to_input(a))
            same = to_frames(model.decode(ids, torch.from_numpy(scene_vector(pw.a.scene))[None].expand(VIEWS, -1)))
            skin = to_frames(model.decode(ids, torch.from_numpy(scene_vector(pw.b.scene))[None].expand(VIEWS, -1)))
        used.update(ids.unique().tolist())
        real.append(a)
        rec.append(same)
        skin_real.append(b)
        skin_rec.append(skin)
        rows.append(np.concatenate([a[0], same[0], b[0], skin[0]], 1))
    truth, made = np.concatenate(real), np.concatenate(rec)
    groups = np.repeat(np.arange(worlds), VIEWS)
    res = {
        "psnr": pooled_psnr(made, truth),
        "psnr_reskin": pooled_psnr(np.concatenate(skin_rec), np.concatenate(skin_real)),
        "psnr_blocks4": pooled_psnr(blocky(truth, 4), truth),
        "psnr_blocks16": pooled_psnr(blocky(truth, 16), truth),
        "c2st": c2st_accuracy(truth, made, groups, groups),
        "c2st_control": c2st_accuracy(truth, blur4(truth), groups, groups),
        "codes_used": float(len(used)),
    }
    return res, np.concatenate(rows, 0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="The ground tokenizer's reconstructions of held-out ground.")
    ap.add_argument("--weights", type=Path, default=COMMITTED, help="the tokenizer (no suffix)")
    ap.add_argument("--worlds", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", type=Path, default=Path("runs/quality"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    res, strip = measure(args.weights, args.worlds, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"tokenizer_{BUCKET}.png"
    Image.fromarray(strip).resize((strip.shape[1] * 2, strip.shape[0] * 2), Image.NEAREST).save(path)
    print(f"strip (view, reconstruction, re-skinned view, re-skin): {path}")
    print("tokenizer " + " ".join(f"{k}={v:.3f}" for k, v in res.items()))


if __name__ == "__main__":
    main()
