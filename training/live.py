"""The live stage: the causal model learns to draw what moves from the live state's channels.

    python -m training.live --out checkpoints/live --minutes 100 --threads 1

Starts from the served weights (``--base``, the committed default) with the state channels
added (``ModelConfig.state_channels``; the new stem and head start at zero, so the model
starts as it serves today), and trains on the world's frames with everything in them as
targets. Each frame's inputs are the canvas reference of its ground (the ground alone through
the ground tokenizer, as ``training/canvas_refs.py`` makes it) and the live state's channels
from the world's own actors, clouds and fog at that frame (``training/live_data.py``).
Squared error, weighted up under the actors' footprints (``--actor-weight``), teacher forcing
in one pass (``training.train.train_step``), under the reference trust a canvas is served
with (``--trust``): the head learns to draw what moves over a canvas it copies.

Only the parts named by ``--train-only`` learn (by default the state's stem and head: with
the state's channels at zero the model is then exactly the served one, and its rollouts stay
as steady); the rest stays at the served weights. On ``--rollout-share`` of the steps the
context is the model's own few-step frames (``self_rollout``), so what it drew of the things
that moved is in the previous frame it reads, as in serving. The checkpoint
(``out/ckpt.safetensors``: ``model.``, ``ema.`` and ``opt.`` of the trained parameters only,
beside ``out/ckpt.json``) is small and is committed; ``--resume`` continues it on top of
``--base``. ``--export`` writes the EMA weights as servable weights; ``--export-parts`` the live parts
alone, which the server lays on the default weights (``model/default/weights/live``).

Next (not in this stage): squared error averages what the state leaves open (the exact look
of a new herd, the shimmer's phase) toward grey; a short adversarial stage over rollouts
(``training/critic.py``, as ``--adv-weight`` in ``training/train.py``) is where that goes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.reference.canvas.ground import TRUST
from worldserve.model.default.reference.live.channels import STATE_CHANNELS
from worldserve.model.default.weights import config_path, save_live_parts, save_model
from worldserve.model.memory import tune_malloc
from worldserve.training.canvas_refs import CanvasReferences
from worldserve.training.checkpoint import init_from_weights
from worldserve.training.live_data import LivePool, pixel_weights
from worldserve.training.optim import freeze_except, hold_at_ema, make_optimizer
from worldserve.training.optim_state import load_optimizer_tensors, optimizer_tensors
from worldserve.training.train import train_step

TRAINED = ("state_stems.", "state_heads.", "state_basis")


@dataclass
class LiveConfig:
    out: str = "checkpoints/live"
    base: str = "model/default/weights/default"  # the served weights the stage starts from
    minutes: float = 60.0
    max_steps: int = 1_000_000
    batch: int = 6  # sequences per step (64 px)
    seq_frames: int = 8
    lr: float = 5e-5
    new_module_lr_scale: float = 10.0  # the state's stem and head, new to the base weights
    warmup: int = 30
    weight_decay: float = 0.0
    ema: float = 0.99
    train_only: tuple[str, ...] = TRAINED
    rollout_share: float = 0.3  # steps whose context is the model's own few-step frames (``self_rollout``)
    basis: int = 8  # learned per-pixel shape features per kind (``ModelConfig.state_basis``)
    trust: float = TRUST  # the reference trust the stage trains under: serving's on a canvas
    actor_weight: float = 4.0  # loss weight under an actor's footprint (1 elsewhere)
    actor_share: float = 0.75  # sequences that start with the camera over an actor
    still_share: float = 0.25
    worlds: int = 6
    world_refresh: int = 30
    map_size: int = 1024
    checkpoint_minutes: float = 4.0
    seed: int = 0
    threads: int = 1


def _trained(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def save(out: Path, model: WorldModel, ema: WorldModel, opt: torch.optim.Optimizer, meta: dict) -> None:
    names = set(_trained(model))
    tensors = {f"model.{n}": p for n, p in model.named_parameters() if n in names}
    tensors.update({f"ema.{n}": p for n, p in ema.named_parameters() if n in names})
    tensors.update(optimizer_tensors(opt, model, "opt."))
    tmp = out / "ckpt.tmp.safetensors"
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
    tmp.replace(out / "ckpt.safetensors")
    (out / "ckpt.json").write_text(json.dumps(meta, indent=2))


def build(lc: LiveConfig) -> tuple[ModelConfig, WorldModel, WorldModel]:
    """The base weights with the state channels added, as model and EMA."""
    base_cfg = ModelConfig.from_json(config_path(Path(lc.base).with_suffix(".safetensors")).read_text())
    cfg = replace(base_cfg, state_channels=STATE_CHANNELS, state_basis=lc.basis, reference_trust=lc.trust)
    model, ema = WorldModel(cfg), WorldModel(cfg)
    init_from_weights(model, ema, Path(lc.base))
    ema.requires_grad_(False)
    return cfg, model, ema


def train(lc: LiveConfig, resume: bool, export: Path | None, export_parts: Path | None = None) -> dict:
    tune_malloc()
    torch.set_num_threads(lc.threads)
    out = Path(lc.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, model, ema = build(lc)
    freeze_except(model, lc.train_only)
    fresh = frozenset(n for n in _trained(model) if n.startswith(TRAINED))
    opt = make_optimizer(model, lc, fresh)  # type: ignore[arg-type]
    meta: dict = {"step": 0, "cpu_seconds": 0.0, "wall_seconds": 0.0, "history": [], "base": lc.base,
                  "model": json.loads(cfg.to_json())}
    if resume and (out / "ckpt.safetensors").exists():
        tensors = load_file(str(out / "ckpt.safetensors"))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if f"model.{n}" in tensors:
                    p.copy_(tensors[f"model.{n}"])
            for n, p in ema.named_parameters():
                if f"ema.{n}" in tensors:
                    p.copy_(tensors[f"ema.{n}"])
        load_optimizer_tensors(opt, model, tensors, "opt.")
        meta = json.loads((out / "ckpt.json").read_text())
        print(f"resumed from {out} at step {meta['step']}", file=sys.stderr)
    hold_at_ema(model, ema)
    step0 = meta["step"]
    g = torch.Generator().manual_seed(lc.seed * 1_000_003 + step0)
    rng = np.random.default_rng([lc.seed, step0, 1])  # which steps roll out
    pool = LivePool(lc.worlds, np.random.default_rng([lc.seed, step0]), lc.map_size, lc.actor_share,
                    lc.still_share, lc.world_refresh)
    canvas = CanvasReferences.load(torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    pairs = [(e, p) for (n, p), e in zip(model.named_parameters(), ema.parameters(), strict=True) if p.requires_grad]
    budget = lc.minutes * 60
    t_start, cpu_start = time.perf_counter(), time.process_time()
    last_ckpt, step, losses = t_start, step0, []
    model.train()

    def checkpoint() -> None:
        nonlocal t_start, cpu_start
        now, cpu = time.perf_counter(), time.process_time()
        meta["wall_seconds"] += now - t_start
        meta["cpu_seconds"] += cpu - cpu_start
        t_start, cpu_start = now, cpu
        meta["step"] = step
        save(out, model, ema, opt, meta)

    run_start = time.perf_counter()
    while step < lc.max_steps and time.perf_counter() - run_start < budget:
        batch = pool.batch(lc.batch, lc.seq_frames)
        batch["weights"] = pixel_weights(batch["states"], lc.actor_weight)
        for grp in opt.param_groups:  # warm-up then flat (a run's end is not known: sessions resume)
            grp["lr"] = lc.lr * min(1.0, (step + 1) / lc.warmup) * grp["scale"]
        rollout = bool(rng.random() < lc.rollout_share)
        loss, stats = train_step(model, batch, cfg, g, rollout, canvas=canvas)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            d = min(lc.ema, (1 + step - step0) / (10 + step - step0))
            for e, p in pairs:
                e.lerp_(p, 1 - d)
        losses.append(float(loss.detach()))
        step += 1
        if step % 10 == 0:
            extra = " ".join(f"{k}={float(v):.4f}" for k, v in sorted(stats.items()) if np.isfinite(float(v)))
            minutes = (time.perf_counter() - run_start) / 60
            print(f"step {step} {minutes:.1f} min loss={np.mean(losses[-10:]):.5f} {extra}",
                  flush=True)
        if step % 50 == 0:
            meta["history"].append({"step": step, "loss": float(np.mean(losses[-50:]))})
        if time.perf_counter() - last_ckpt > lc.checkpoint_minutes * 60:
            checkpoint()
            last_ckpt = time.perf_counter()
    checkpoint()
    report = {"steps": step, "steps_this_run": step - step0,
              "loss_first_10_this_run": float(np.mean(losses[:10])) if losses else None,
              "loss_last_50": float(np.mean(losses[-50:])) if losses else None,
              "cpu_seconds_total": meta["cpu_seconds"], "config": asdict(lc)}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    if export is not None:
        save_model(ema, export, metadata={"steps": str(step)})
    if export_parts is not None:
        save_live_parts(ema, export_parts, metadata={"steps": str(step), "base": lc.base})
    print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=2))
    return report


def load_live(out: str | Path = "checkpoints/live", base: str = LiveConfig.base) -> WorldModel:
    """The EMA weights of a live checkpoint on top of its base: a model with state channels."""
    lc = LiveConfig(out=str(out), base=base)
    _, _, ema = build(lc)
    tensors = load_file(str(Path(out) / "ckpt.safetensors"))
    with torch.no_grad():
        for n, p in ema.named_parameters():
            if f"ema.{n}" in tensors:
                p.copy_(tensors[f"ema.{n}"])
    return ema.eval()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the causal model to draw the live state (what moves).")
    defaults = LiveConfig()
    for f in fields(LiveConfig):
        flag, default = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if isinstance(default, bool):
            ap.add_argument(flag, action="store_true")
        elif isinstance(default, tuple):
            ap.add_argument(flag, type=lambda t: tuple(w for w in t.split(",") if w), default=default)
        else:
            ap.add_argument(flag, type=type(default), default=default)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--export", type=Path, default=None, help="write the EMA weights here (.safetensors + .json)")
    ap.add_argument("--export-parts", type=Path, default=None,
                    help="write the EMA's live parts alone here, to lay on the base (model/default/weights/live)")
    args = ap.parse_args(argv)
    lc = LiveConfig(**{f.name: getattr(args, f.name) for f in fields(LiveConfig)})
    train(lc, args.resume, args.export, args.export_parts)


if __name__ == "__main__":
    main()
