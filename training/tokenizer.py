"""Training the ground tokenizer (``model/default/reference/canvas/tokenizer.py``), the first stage of the world
canvas (issue 38, item 3).

    python -m training.tokenizer --out runs/tokenizer --minutes 60 --export model/default/weights/tokenizer
    python -m training.tokenizer --out runs/tokenizer --resume --minutes 60 ...   # continue

Data: views of the ground alone (``World.render_ground``: the map and the rain or snow lying
on it; no actors, water glints, cloud shadows or fog) of training worlds at random places,
``--crop``-pixel windows of 64-px views. Each item is encoded under one scene and decoded
under a second scene of the same biome, vegetation and weather (the same geometry: trees grow
by biome and vegetation, rain and snow lie where the weather puts them) with a fresh time of
day and season, or under the same scene (``--same-share``); the loss is the squared error to
the view under the decoder's scene, plus the quantizer's term. So the codes carry the place
and the decoder the look.

``--resume`` continues ``--out``'s checkpoint (model, Adam, step); without one there, it
starts from the committed export (``--init``, weights only, a fresh Adam), so the stage goes
on across sessions. Codes unused for ``REVIVE_EVERY`` steps are moved to encoder outputs of
the current batch. Every ``--eval-every`` steps and at the end: held-out PSNR of static views
of ``EVAL_SEEDS`` (same scene, and re-skinned to another scene), and how many codes those
views use. The export is half precision with the report beside it; the checkpoint (with Adam's
moments) stays under ``--out`` and is never committed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from worldserve.model.default.reference.canvas.tokenizer import (
    UPSAMPLING,
    WEIGHTS,
    GroundTokenizer,
    TokenizerConfig,
    load_tokenizer,
    save_tokenizer,
)
from worldserve.training import atomic
from worldserve.training.critic import Adversary
from worldserve.training.data import TRAIN_SEED_BASE
from worldserve.training.optim import adv_ramp
from worldserve.training.optim_state import load_optimizer_tensors, optimizer_tensors
from worldserve.training.train import HELD_OUT_SEEDS
from worldserve.world import DEFAULT_MAP_SIZE, World, sample_scene
from worldserve.world.scene import ATTRIBUTES, SceneAttrs

BUCKET = 64  # one code per 4x4 world units
EVAL_SEEDS = tuple(HELD_OUT_SEEDS[900:908])  # held out, and used by no bench
EVAL_VIEWS = 8  # per eval seed
KEPT = 64  # view pairs a training world keeps for ``--reuse``
REVIVE_EVERY = 200  # steps: a code unused for this long moves to an encoder output
COMMITTED = WEIGHTS


@dataclass
class TokenizerTrainConfig:
    out: Path = Path("runs/tokenizer")
    minutes: float = 30.0  # wall-clock budget of this run
    steps: int = 0  # stop after this many steps of this run too (0: the minutes alone)
    batch: int = 64  # crops a step
    crop: int = 32  # px, windows of 64-px views
    lr: float = 5e-4  # Adam, after a warm-up of 50 steps
    lr_end: float = 0.0  # > 0: cosine decay from ``lr`` to this over the run's minutes (0: constant)
    decoder_only: bool = False  # train the decoder alone: the codes (and the bank built on them) stay valid
    adv_weight: float = 0.0  # the critic's term, scaled to the squared error's gradient (0: no critic)
    adv_warmup: int = 100  # steps the critic trains alone (the model holds still), then as many ramping its term in
    adv_lr: float = 2e-4
    critic_width: int = 16  # the critic's first convolution's channels (doubled twice deeper)
    worlds: int = 8  # training worlds in the pool; one is replaced every 50 steps
    reuse: int = 1  # > 1: a world renders 1/reuse of its views a step and draws the rest from its last 64
    same_share: float = 0.5  # share of items decoded under the scene they were encoded from
    seed: int = 0
    threads: int = 1
    eval_every: int = 200
    checkpoint_minutes: float = 10.0
    map_size: int = DEFAULT_MAP_SIZE
    # a fresh model's; a resumed or --init one keeps its own
    model: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(norm_window=32))


def scene_vector(scene: SceneAttrs) -> np.ndarray:
    return scene.to_vector().astype(np.float32)


def relit(scene: SceneAttrs, rng: np.random.Generator) -> SceneAttrs:
    """The same biome, vegetation and weather (the same ground), another time and season."""
    return replace(scene, time=str(rng.choice(ATTRIBUTES["time"])), season=str(rng.choice(ATTRIBUTES["season"])))


def to_input(frames: np.ndarray) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 127.5 - 1


class PairedWorld:
    """One place under two scenes (two ``World``s sharing a layout)."""

    def __init__(self, seed: int, rng: np.random.Generator, map_size: int):
        self.a = World(seed, None, (BUCKET,), map_size=map_size)
        self.b = World(seed, None, (BUCKET,), map_size=map_size, layout=self.a.layout)
        self.kept: list[tuple[np.ndarray, np.ndarray]] = []  # recent view pairs under the current scenes
        self.rescene(rng, 0.0)

    def rescene(self, rng: np.random.Generator, same_share: float) -> None:
        scene = sample_scene(rng)
        self.a.set_scene(scene)
        self.b.set_scene(scene if rng.random() < same_share else relit(scene, rng))
        self.kept.clear()

    def recent_views(self, n: int, reuse: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` view pairs, ``n // reuse`` (at least one) of them rendered now and the rest drawn
        from the last ``KEPT`` rendered under the same scenes (rendering is most of a step's time)."""
        fresh = n if len(self.kept) < n else max(1, n // reuse)
        a, b = self.views(fresh, rng)
        self.kept = (self.kept + list(zip(a, b, strict=True)))[-KEPT:]
        pick = rng.choice(len(self.kept), n, replace=False)
        return np.stack([self.kept[i][0] for i in pick]), np.stack([self.kept[i][1] for i in pick])

    def views(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` places: the ground under scene a and under scene b, each (n, 64, 64, 3)."""
        a, b = [], []
        for _ in range(n):
            pos = self.a.random_position(rng, max_water=0.8, max_rock=0.6)
            self.a.reset(pos)
            self.b.reset(pos)
            a.append(self.a.render_ground(BUCKET))
            b.append(self.b.render_ground(BUCKET))
        return np.stack(a), np.stack(b)


class GroundBatches:
    def __init__(self, tc: TokenizerTrainConfig, rng: np.random.Generator):
        self.tc, self.rng = tc, rng
        self.next_seed = TRAIN_SEED_BASE + int(rng.integers(0, 1_000_000))
        self.pool = [self._new() for _ in range(tc.worlds)]
        self.calls = 0

    def _new(self) -> PairedWorld:
        self.next_seed += 1
        return PairedWorld(self.next_seed, self.rng, self.tc.map_size)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(encoder input, decoder scene, target): crops (B, 3, c, c), scenes (B, S)."""
        tc, rng = self.tc, self.rng
        self.calls += 1
        if self.calls % 50 == 0:
            self.pool[int(rng.integers(len(self.pool)))] = self._new()
        w = self.pool[int(rng.integers(len(self.pool)))]
        w.rescene(rng, tc.same_share)  # one pair of scenes changes a step
        per = tc.batch // len(self.pool)
        src, dst, scenes = [], [], []
        for pw in self.pool:
            a, b = pw.views(per, rng) if tc.reuse <= 1 else pw.recent_views(per, tc.reuse, rng)
            y, x = rng.integers(0, BUCKET - tc.crop + 1, 2)
            src.append(a[:, y : y + tc.crop, x : x + tc.crop])
            dst.append(b[:, y : y + tc.crop, x : x + tc.crop])
            scenes.append(np.repeat(scene_vector(pw.b.scene)[None], per, 0))
        return to_input(np.concatenate(src)), torch.from_numpy(np.concatenate(scenes)), to_input(np.concatenate(dst))


def held_out_views(map_size: int = DEFAULT_MAP_SIZE, seeds: tuple[int, ...] = EVAL_SEEDS,
                   ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per eval seed: views under a scene and its re-skin, and both scene vectors."""
    rng = np.random.default_rng(77)
    out = []
    for s in seeds:
        pw = PairedWorld(s, rng, map_size)
        pw.b.set_scene(relit(pw.a.scene, rng))
        a, b = pw.views(EVAL_VIEWS, rng)
        out.append((a, b, scene_vector(pw.a.scene), scene_vector(pw.b.scene)))
    return out


@torch.no_grad()
def evaluate(model: GroundTokenizer, views: list) -> dict[str, float]:
    """Held-out static views: ``psnr`` (encoded and decoded under the same scene), ``psnr_reskin``
    (encoded under one scene, decoded under the other, against that scene's view),
    ``codes_used`` (distinct codes over all views), ``sharpness`` (the reconstructions' fine
    detail over the views', ``detail``: 1 as sharp as the world, below 1 smeared)."""
    model.eval()
    same, reskin, sharp, used = [], [], [], set()
    for a, b, sa, sb in views:
        xa, xb = to_input(a), to_input(b)
        ids = model.encode(xa)
        used.update(ids.unique().tolist())
        rec = model.decode(ids, torch.from_numpy(sa)[None].expand(len(a), -1)).clamp(-1, 1)
        same.append(float(((rec - xa) ** 2).mean()))
        sharp.append(float(detail(rec).mean() / detail(xa).mean().clamp_min(1e-6)))
        reskinned = model.decode(ids, torch.from_numpy(sb)[None].expand(len(a), -1)).clamp(-1, 1)
        reskin.append(float(((reskinned - xb) ** 2).mean()))
    model.train()
    return {"psnr": psnr_db(same), "psnr_reskin": psnr_db(reskin), "codes_used": float(len(used)),
            "sharpness": float(np.mean(sharp))}


def psnr_db(errs: list[float]) -> float:
    """PSNR of frames in [-1, 1] (a range of 2) from their mean squared errors."""
    return float(10 * np.log10(4.0 / max(float(np.mean(errs)), 1e-12)))


def detail(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) -> (B,): the mean absolute Laplacian, how much fine detail a frame holds."""
    k = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]]).expand(3, 1, 3, 3)
    return F.conv2d(x, k, groups=3).abs().mean((1, 2, 3))


def revive(model: GroundTokenizer, usage: torch.Tensor, z: torch.Tensor, gen: torch.Generator) -> int:
    """Move codes unused since the last revival to random encoder outputs ``z`` (B, D, h, w)."""
    dead = (usage == 0).nonzero().flatten()
    if len(dead):
        flat = F.normalize(z.detach(), dim=1).permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        pick = torch.randint(len(flat), (len(dead),), generator=gen)
        with torch.no_grad():
            model.quantizer.codebook[dead] = flat[pick]
    usage.zero_()
    return len(dead)


def save_checkpoint(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, meta: dict,
                    adversary: Adversary | None = None) -> None:
    """``out``/ckpt.safetensors (the model, Adam's moments, the critic's) and ckpt.json (``meta``)."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()} | optimizer_tensors(opt, model, "opt.")
    if adversary is not None:
        tensors |= adversary.state()
    tmp = out / "ckpt.tmp.safetensors"
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, out / "ckpt.safetensors")
    atomic.write_text(out / "ckpt.json", json.dumps(meta, indent=2))


def start(tc: TokenizerTrainConfig, resume: bool, init: Path | None,
          upsample: str | None = None) -> tuple[GroundTokenizer, torch.optim.Optimizer, dict]:
    """The model, its optimizer and the run's bookkeeping: fresh, from ``--out``'s checkpoint,
    or from the committed export ``init`` (weights only; ``upsample`` sets its decoder's
    upsampling, the weights unchanged)."""
    meta: dict = {"step": 0, "seconds": 0.0, "history": []}
    if resume and (tc.out / "ckpt.safetensors").exists():
        meta = json.loads((tc.out / "ckpt.json").read_text())
        cfg = meta["model"]
        model = GroundTokenizer(TokenizerConfig(**{**cfg, "widths": tuple(cfg["widths"])}))
        tensors = load_file(str(tc.out / "ckpt.safetensors"))
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        opt = torch.optim.Adam(model.parameters(), lr=tc.lr)
        load_optimizer_tensors(opt, model, tensors, "opt.")
        print(f"resumed {tc.out} at step {meta['step']}", file=sys.stderr)
        return model.train(), opt, meta
    if resume and init is not None and init.with_suffix(".json").exists():
        model = load_tokenizer(init)
        if upsample is not None and upsample != model.cfg.upsample:
            weights = model.state_dict()
            model = GroundTokenizer(replace(model.cfg, upsample=upsample))
            model.load_state_dict(weights)
        prior = json.loads(init.with_suffix(".json").read_text()).get("report", {})
        meta.update(step=int(prior.get("steps", 0)), seconds=float(prior.get("seconds", 0.0)))
        print(f"started from {init} (step {meta['step']}), a fresh optimizer", file=sys.stderr)
    else:
        torch.manual_seed(tc.seed)
        model = GroundTokenizer(tc.model if upsample is None else replace(tc.model, upsample=upsample))
    return model.train(), torch.optim.Adam(model.parameters(), lr=tc.lr), meta


def lr_at(tc: TokenizerTrainConfig, run_step: int, progress: float) -> float:
    """The learning rate ``run_step`` steps into this run, ``progress`` (0..1) through its budget."""
    warm = min(1.0, (run_step + 1) / 50)
    if tc.lr_end <= 0:
        return tc.lr * warm
    return warm * (tc.lr_end + 0.5 * (tc.lr - tc.lr_end) * (1 + math.cos(math.pi * min(1.0, progress))))


def adaptive_weight(rec: torch.Tensor, adv: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The critic's term scaled so that its gradient at the decoder's last layer ``last`` is as
    large as the squared error's (VQGAN's balance): a fixed weight would be either lost next
    to an error of 0.01 or swamp it."""
    g_rec = torch.autograd.grad(rec, last, retain_graph=True)[0].norm()
    g_adv = torch.autograd.grad(adv, last, retain_graph=True)[0].norm()
    return (g_rec / (g_adv + 1e-6)).clamp(0.0, 1e3).detach()


def train(tc: TokenizerTrainConfig, resume: bool, export: Path | None, init: Path | None = COMMITTED,
          argv: list[str] | None = None, upsample: str | None = None) -> dict:
    torch.set_num_threads(tc.threads)
    model, opt, meta = start(tc, resume, init, upsample)
    meta["model"] = asdict(model.cfg)
    if tc.decoder_only:  # Adam leaves parameters without a gradient alone
        model.encoder.requires_grad_(False)
        model.quantizer.requires_grad_(False)
    adversary = Adversary(3, model.cfg.scene_dim, tc.adv_lr, width=tc.critic_width) if tc.adv_weight > 0 else None
    if adversary is not None and resume and (tc.out / "ckpt.safetensors").exists():
        adversary.load(load_file(str(tc.out / "ckpt.safetensors")))
    rng = np.random.default_rng([tc.seed, meta["step"]])
    gen = torch.Generator().manual_seed(tc.seed + meta["step"])
    data = GroundBatches(tc, rng)
    views = held_out_views(tc.map_size, EVAL_SEEDS if tc.map_size == DEFAULT_MAP_SIZE else EVAL_SEEDS[:2])
    usage = torch.zeros(model.cfg.codes)
    t0 = last_ckpt = time.perf_counter()
    seconds0 = meta["seconds"]
    budget = tc.minutes * 60
    first = meta["step"]
    losses: list[float] = []
    while time.perf_counter() - t0 < budget and not (tc.steps and meta["step"] - first >= tc.steps):
        src, scene, dst = data.batch()
        run_step = meta["step"] - first
        progress = max((time.perf_counter() - t0) / budget, run_step / tc.steps if tc.steps else 0.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(tc, run_step, progress)
        ramp = adv_ramp(run_step, tc)
        # a fresh critic learns the views alone first: stepped on squared error alone meanwhile,
        # a sharpened decoder would drift back toward the blur the critic was brought in against
        hold = adversary is not None and ramp == 0
        with torch.set_grad_enabled(not tc.decoder_only and not hold):
            z = model.encoder(src)
            q, ids, vq_loss = model.quantizer(z)
        with torch.set_grad_enabled(not hold):
            pred = model.decoder(q, scene)
        rec = F.mse_loss(pred, dst)
        loss = rec + vq_loss if not tc.decoder_only else rec
        if adversary is not None:
            adv = adversary.generator_loss(pred[:, None], dst[:, None], scene[:, None], gen)
            if ramp > 0:
                loss = loss + tc.adv_weight * ramp * adaptive_weight(rec, adv, model.decoder.out.weight) * adv
        if not hold:
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if adversary is not None:
            adversary.critic_step()
        usage += torch.bincount(ids.flatten(), minlength=model.cfg.codes)
        meta["step"] += 1
        losses.append(float(rec.detach()))
        if meta["step"] % REVIVE_EVERY == 0 and not tc.decoder_only and not hold:  # a hold moves no code either
            n = revive(model, usage, z, gen)
            print(f"step {meta['step']}: {n} unused codes revived", file=sys.stderr)
        if meta["step"] % tc.eval_every == 0:
            ev = evaluate(model, views)
            meta["history"].append({"step": meta["step"], "mse": float(np.mean(losses))} | ev)
            losses = []
            print(f"step {meta['step']} ({time.perf_counter() - t0:.0f} s): " + json.dumps(meta["history"][-1]),
                  file=sys.stderr)
        if time.perf_counter() - last_ckpt > tc.checkpoint_minutes * 60:
            meta["seconds"] = seconds0 + time.perf_counter() - t0
            save_checkpoint(tc.out, model, opt, meta, adversary)
            last_ckpt = time.perf_counter()
    meta["seconds"] = seconds0 + time.perf_counter() - t0
    ev = evaluate(model, views)
    meta["final"] = ev
    save_checkpoint(tc.out, model, opt, meta, adversary)
    report = {"steps": meta["step"], "seconds": round(meta["seconds"]), "threads": tc.threads, "held_out": ev,
              "command": "python -m training.tokenizer " + " ".join(argv or []),
              "train": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(tc).items() if k != "model"}}
    if export is not None:
        save_tokenizer(model, export, report)
    print(json.dumps(report))
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the ground tokenizer (a VQ autoencoder of the world's ground).")
    ap.add_argument("--out", type=Path, default=TokenizerTrainConfig.out)
    ap.add_argument("--resume", action="store_true",
                    help="continue --out's checkpoint; without one, start from --init's weights")
    ap.add_argument("--init", type=Path, default=COMMITTED, help="committed weights to start from (no suffix)")
    ap.add_argument("--export", type=Path, default=None, help="write half-precision weights there (no suffix)")
    ap.add_argument("--upsample", choices=UPSAMPLING, default=None,
                    help="the decoder's upsampling (default: the weights' own); its weights carry over")
    ap.add_argument("--decoder-only", action="store_true",
                    help="train the decoder alone (the codes, and the bank built on them, stay valid)")
    names = ("minutes", "steps", "batch", "crop", "lr", "lr_end", "adv_weight", "adv_warmup", "adv_lr", "critic_width",
             "worlds", "reuse", "same_share", "seed", "threads", "eval_every", "checkpoint_minutes", "map_size")
    for name in names:
        default = getattr(TokenizerTrainConfig, name)
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = ap.parse_args(argv)
    tc = TokenizerTrainConfig(out=args.out, decoder_only=args.decoder_only, **{k: getattr(args, k) for k in names})
    train(tc, args.resume, args.export, args.init, argv if argv is not None else sys.argv[1:], args.upsample)


if __name__ == "__main__":
    main()
