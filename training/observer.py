"""Training the observation encoder (``model/default/reference/canvas/observer.py``), the canvas's second encoder.

    python -m training.observer --out runs/observer --minutes 60 --export model/default/weights/observer
    python -m training.observer --out runs/observer --resume --minutes 60 ...   # continue

Data: training worlds under random scenes; the camera at a random place after the world has
moved for a random number of frames (animals and boats walk, clouds and rain move), the frame
as it is seen (``World.render``) beside the ground alone under it (``World.render_ground``).
The target is what the ground tokenizer's encoder (``--tokenizer``, frozen) gives the ground:
the observation encoder, started from that encoder, learns to give the same vectors from the
seen frame (one minus their cosine, the quantizer's own measure), so that the nearest code
is the ground's. The codebook does not move, so its codes are the canvas's and the bank's.
(Cross-entropy over the 1,024 codes instead, the logits the cosines over a temperature of
0.05, lost to the untrained encoder: held-out ``psnr`` 20.8 -> 19.9 dB in 200 steps.)

Every ``--eval-every`` steps and at the end, on held-out worlds (``EVAL_SEEDS``): ``agree``,
the share of codes the encoder gives a seen frame that are the ground's own codes, beside
``agree_base`` (the tokenizer's encoder on the same frames: what observations wrote before);
``psnr`` and ``psnr_base``, the ground decoded from those codes against the ground view.

``--resume`` continues ``--out``'s checkpoint; without one, it starts from the committed export
(``--init``) where there is one, else from the tokenizer's encoder.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from worldserve.model.default.reference.canvas.observer import (
    OBSERVER,
    load_observer,
    observer_from,
    save_observer,
)
from worldserve.model.default.reference.canvas.tokenizer import (
    WEIGHTS,
    Encoder,
    GroundTokenizer,
    load_tokenizer,
)
from worldserve.protocol.vocab import ACTION_DIM
from worldserve.training.data import TRAIN_SEED_BASE
from worldserve.training.optim_state import load_optimizer_tensors
from worldserve.training.tokenizer import BUCKET, psnr_db, save_checkpoint, scene_vector, to_input
from worldserve.training.train import HELD_OUT_SEEDS
from worldserve.world import DEFAULT_MAP_SIZE, World, sample_scene

EVAL_SEEDS = tuple(HELD_OUT_SEEDS[908:912])  # held out, and used by no bench
EVAL_VIEWS = 16  # per eval seed
SEED_OFFSET = 3_000_000  # training worlds apart from the other stages'
MOVE_FRAMES = 48  # the world moves up to this many frames before a view
STILL = np.zeros(ACTION_DIM, np.float32)  # the camera stays while the world moves


@dataclass
class ObserverTrainConfig:
    out: Path = Path("runs/observer")
    minutes: float = 30.0
    steps: int = 0  # stop after this many steps of this run too (0: the minutes alone)
    batch: int = 32  # views a step
    lr: float = 2e-4
    worlds: int = 4  # in the pool; one is replaced every 50 steps
    seed: int = 0
    threads: int = 1
    eval_every: int = 200
    checkpoint_minutes: float = 10.0
    map_size: int = DEFAULT_MAP_SIZE


def seen_and_ground(world: World, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` places of ``world``: the frame as seen, the ground alone (each (n, 64, 64, 3)
    uint8) and the scene vectors (n, S)."""
    seen, ground = [], []
    for _ in range(n):
        world.reset(world.random_position(rng, max_water=0.9, max_rock=0.6))
        for _ in range(int(rng.integers(0, MOVE_FRAMES + 1))):
            world.step(STILL)
        seen.append(world.render(BUCKET))
        ground.append(world.render_ground(BUCKET))
    scenes = np.repeat(scene_vector(world.scene)[None], n, 0)
    return np.stack(seen), np.stack(ground), scenes


class ViewPool:
    """Training worlds, each under a random scene that changes every step for one of them."""

    def __init__(self, tc: ObserverTrainConfig, rng: np.random.Generator):
        self.tc, self.rng = tc, rng
        self.next_seed = TRAIN_SEED_BASE + SEED_OFFSET + int(rng.integers(0, 1_000_000))
        self.pool = [self._new() for _ in range(tc.worlds)]
        self.calls = 0

    def _new(self) -> World:
        self.next_seed += 1
        return World(self.next_seed, sample_scene(self.rng), (BUCKET,), map_size=self.tc.map_size)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(seen (B, 3, 64, 64), ground (B, 3, 64, 64), scenes (B, S))."""
        self.calls += 1
        if self.calls % 50 == 0:
            self.pool[int(self.rng.integers(len(self.pool)))] = self._new()
        self.pool[int(self.rng.integers(len(self.pool)))].set_scene(sample_scene(self.rng))
        per = max(1, self.tc.batch // len(self.pool))
        parts = [seen_and_ground(w, per, self.rng) for w in self.pool]
        seen, ground, scenes = (np.concatenate(p) for p in zip(*parts, strict=True))
        return to_input(seen), to_input(ground), torch.from_numpy(scenes)


def held_out(map_size: int = DEFAULT_MAP_SIZE) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(88)
    out = []
    for s in EVAL_SEEDS:
        world = World(s, sample_scene(rng), (BUCKET,), map_size=map_size)
        seen, ground, scenes = seen_and_ground(world, EVAL_VIEWS, rng)
        out.append((to_input(seen), to_input(ground), torch.from_numpy(scenes)))
    return out


@torch.no_grad()
def evaluate(tok: GroundTokenizer, observer: Encoder, views: list) -> dict[str, float]:
    """``agree`` / ``agree_base`` and ``psnr`` / ``psnr_base`` (module docstring)."""
    observer.eval()
    agree, agree_base, err, err_base = [], [], [], []
    for seen, ground, scenes in views:
        target = tok.encode(ground)
        ids, base = tok.quantizer.ids(observer(seen)), tok.encode(seen)
        agree.append(float((ids == target).float().mean()))
        agree_base.append(float((base == target).float().mean()))
        err.append(float(((tok.decode(ids, scenes).clamp(-1, 1) - ground) ** 2).mean()))
        err_base.append(float(((tok.decode(base, scenes).clamp(-1, 1) - ground) ** 2).mean()))
    observer.train()
    return {"agree": float(np.mean(agree)), "agree_base": float(np.mean(agree_base)),
            "psnr": psnr_db(err), "psnr_base": psnr_db(err_base)}


def start(tc: ObserverTrainConfig, tok: GroundTokenizer, resume: bool,
          init: Path) -> tuple[Encoder, torch.optim.Optimizer, dict]:
    """The encoder, its optimizer and the run's bookkeeping: from ``--out``'s checkpoint, the
    committed export ``init`` (weights and step count, a fresh Adam), or the tokenizer's encoder."""
    meta: dict = {"step": 0, "seconds": 0.0, "history": []}
    ckpt = tc.out / "ckpt.safetensors"
    if resume and ckpt.exists():
        meta = json.loads((tc.out / "ckpt.json").read_text())
        tensors = load_file(str(ckpt))
        enc = Encoder(tok.cfg)
        enc.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        opt = torch.optim.Adam(enc.parameters(), lr=tc.lr)
        load_optimizer_tensors(opt, enc, tensors, "opt.")
        print(f"resumed {tc.out} at step {meta['step']}", file=sys.stderr)
        return enc, opt, meta
    enc = load_observer(init, tok) if resume else None
    if enc is not None:
        report = json.loads(init.with_suffix(".json").read_text()).get("report", {})
        meta.update(step=int(report.get("steps", 0)), seconds=float(report.get("seconds", 0.0)))
        print(f"started from {init} (step {meta['step']})", file=sys.stderr)
    else:
        enc = observer_from(tok)
    return enc, torch.optim.Adam(enc.parameters(), lr=tc.lr), meta


def train(tc: ObserverTrainConfig, resume: bool, export: Path | None, tokenizer: Path = WEIGHTS,
          init: Path = OBSERVER, argv: list[str] | None = None) -> dict:
    torch.set_num_threads(tc.threads)
    tok = load_tokenizer(tokenizer).requires_grad_(False)
    observer, opt, meta = start(tc, tok, resume, init)
    observer.train()
    rng = np.random.default_rng([tc.seed, meta["step"]])
    data = ViewPool(tc, rng)
    views = held_out(tc.map_size)
    t0 = last_ckpt = time.perf_counter()
    seconds0, first, losses = meta["seconds"], meta["step"], []
    while time.perf_counter() - t0 < tc.minutes * 60 and not (tc.steps and meta["step"] - first >= tc.steps):
        seen, ground, _ = data.batch()
        with torch.no_grad():
            target = F.normalize(tok.encoder(ground), dim=1)  # (B, D, h, w)
        loss = 1 - (F.normalize(observer(seen), dim=1) * target).sum(1).mean()
        for g in opt.param_groups:
            g["lr"] = tc.lr * min(1.0, (meta["step"] - first + 1) / 50)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        meta["step"] += 1
        losses.append(float(loss.detach()))
        if meta["step"] % tc.eval_every == 0:
            scores = evaluate(tok, observer, views)
            meta["history"].append({"step": meta["step"], "loss": float(np.mean(losses))} | scores)
            losses = []
            print(f"step {meta['step']} ({time.perf_counter() - t0:.0f} s): " + json.dumps(meta["history"][-1]),
                  file=sys.stderr)
        if time.perf_counter() - last_ckpt > tc.checkpoint_minutes * 60:
            meta["seconds"] = seconds0 + time.perf_counter() - t0
            save_checkpoint(tc.out, observer, opt, meta)
            last_ckpt = time.perf_counter()
    meta["seconds"] = seconds0 + time.perf_counter() - t0
    meta["final"] = evaluate(tok, observer, views)
    save_checkpoint(tc.out, observer, opt, meta)
    report = {"steps": meta["step"], "seconds": round(meta["seconds"]), "threads": tc.threads,
              "held_out": meta["final"], "tokenizer": str(tokenizer),
              "command": "python -m training.observer " + " ".join(argv or []),
              "train": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(tc).items()}}
    if export is not None:
        save_observer(observer, tok, export, report)
    print(json.dumps(report))
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the observation encoder (seen frames -> the ground's codes).")
    ap.add_argument("--out", type=Path, default=ObserverTrainConfig.out)
    ap.add_argument("--resume", action="store_true", help="continue --out's checkpoint; without one, --init's weights")
    ap.add_argument("--init", type=Path, default=OBSERVER, help="committed observer to start from (no suffix)")
    ap.add_argument("--tokenizer", type=Path, default=WEIGHTS, help="the ground tokenizer whose codes it learns")
    ap.add_argument("--export", type=Path, default=None, help="write half-precision weights there (no suffix)")
    names = ("minutes", "steps", "batch", "lr", "worlds", "seed", "threads", "eval_every", "checkpoint_minutes",
             "map_size")
    for name in names:
        default = getattr(ObserverTrainConfig, name)
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = ap.parse_args(argv)
    tc = ObserverTrainConfig(out=args.out, **{k: getattr(args, k) for k in names})
    train(tc, args.resume, args.export, args.tokenizer, args.init, argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
