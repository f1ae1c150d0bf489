"""Train the world model on the procedural world (``world/``).

    python -m training.train --minutes 60 --out runs/default [--resume] [--export model/default/weights/default]

What one step does (teacher forcing in one pass, as CausVid / diffusion forcing):
- sample sequences of ``seq_frames`` frames from episodes of the world (mixed random and
  scripted actions, and with ``still_share`` the calm policy's long still stretches, where a
  rollout must hold the view rather than drift; both buckets, the bigger one less often
  since it costs 4x the tokens); half of them keep the sink far in the past, as in a long
  session;
- build the sequence ``[clean frames; noisy frames]``: every noisy frame is a generation query
  that sees exactly what the KV cache would hold (``dit.sequence_mask``) and is trained to
  predict its clean frame (x0, MSE) at a noise level drawn from the sampler's schedules;
- self-rollout (as Self-Forcing): on a share of the steps the clean context and the previous
  frames are the model's own few-step samples (the cached inference path, no grad), while the
  targets stay the renderer's frames, so the model learns to pull a drifting rollout back
  instead of piling up its errors;
- a quarter of the sequences change scene part-way (every frame carries its own scene
  vector), so a new prompt re-colours the view the way the renderer does;
- an image-gradient term (``edge_loss``, weighted toward low noise) charges for blur;
- optionally a cross-entropy between the warp's motion kernels and the commanded camera shift
  (``motion_loss``), on every frame or only on frames of some weathers (``motion_weathers``:
  in snow and rain the frame loss alone lets the kernels spread and smear the ground);
- optionally, on a share of the self-rollout steps (``carry_share``), the static ground the
  model has already drawn targets its own previous frame moved by the camera
  (``carry_targets``) instead of the renderer's.
- optionally an adversarial term (``--adv-weight``, ``training/critic.py``): a patch critic
  judges the x0 guesses against the renderer's frames;
- optionally a texture term (``--texture-weight``, ``training/texture.py``): the x0 guesses'
  feature statistics against the renderer's frames of the same moments;
- optionally, on a share of the steps (``--bank-share``, ``training/bank.py``), the
  context is the newest frames of long-running sessions of the serving path, and only
  what the model already drew (moved by the camera) and the critic are targets;
- every frame also gets its anchor reference
  (``model/default/reference/anchor.py``): the sequence's first frame (after a far sink, the first frame that
  follows it; on self-rollout steps the rollout's own) moved by the commanded camera shift
  summed since, invalid before it and from a prompt change on; and the model's shift head
  learns the shift per action that serving sums instead (``SHIFT_WEIGHT``).

Checkpoints (``out/ckpt.safetensors`` + ``out/ckpt.json``, ``training/checkpoint.py``) hold
model, EMA and optimizer state as safetensors (no pickle); ``--resume`` continues from them. The
EMA weights are exported.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open

from worldserve.model.default.kv_cache import KVCachePool
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.net.flow import next_noisy, noised
from worldserve.model.default.reference.anchor import anchor_reference, sequence_references
from worldserve.model.default.weights import config_path, save_model
from worldserve.model.memory import tune_malloc
from worldserve.training import atomic
from worldserve.training.bank import RolloutBank
from worldserve.training.canvas_refs import CanvasReferences
from worldserve.training.checkpoint import (
    export_checkpoint,
    init_from_weights,
    load_checkpoint,
    save_checkpoint,
)
from worldserve.training.critic import Adversary
from worldserve.training.data import BatchSource, DataSpec
from worldserve.training.optim import adv_ramp, freeze_except, hold_at_ema, lr_at, make_optimizer
from worldserve.training.targets import (
    anchor_offsets,
    camera_shifts,
    carry_mask,
    carry_shifts,
    carry_targets,
    edge_loss,
    fit_shift_head,
    masked_mse,
    motion_loss,
    moved_frames,
    noise_levels,
    randn,
    shift_targets,
    weather_mask,
)
from worldserve.training.texture import TextureLoss
from worldserve.world import DEFAULT_MAP_SIZE

HELD_OUT_SEEDS = range(0, 1000)  # world seeds the quality bench uses; training never sees them
# the shift head's own term, small: Adam moves its 14 weights at the same pace whatever the
# weight, and at weight 1 its early error (pixels squared) would own the clipped gradient norm
SHIFT_WEIGHT = 0.01
# self-rollout samples with fresh noise at every step (``next_noisy``'s eta 1), as the shipped
# weights were trained; serving takes ``ModelConfig.sampler_eta`` (0) on the same weights
ROLLOUT_ETA = 1.0


@dataclass
class TrainConfig:
    out: str = "runs/default"
    minutes: float = 60.0  # wall-clock budget of this run (resume adds another)
    max_steps: int = 1_000_000
    batch: int = 12  # sequences per step at the smallest bucket
    seq_frames: int = 8  # frames per training sequence (>= sink + window + 1)
    big_bucket_every: int = 4  # every n-th step trains the bigger buckets (batch / 4)
    lr: float = 4e-4
    warmup: int = 150
    weight_decay: float = 0.01
    ema: float = 0.998
    self_rollout_after: int = 600  # steps of plain teacher forcing first
    self_rollout_share: float = 0.35
    rollout_lead: int = 0  # self-rollout steps: frames the model generates before the trained ones
    new_module_lr_scale: float = 1.0  # learning-rate factor for parameters a resumed checkpoint lacks
    train_only: tuple[str, ...] = ()  # parameter-name prefixes that train; the rest stays frozen (empty: all)
    far_sink_share: float = 0.5
    scene_switch_share: float = 0.25  # sequences whose prompt changes part-way
    still_share: float = 0.0  # sequences from the "calm" policy (long still stretches)
    edge_weight: float = 0.1  # image-gradient matching term against blur (0: MSE only)
    motion_weight: float = 0.0  # motion kernels pulled toward the commanded camera shift
    motion_weathers: tuple[str, ...] = ()  # the motion term only on frames of these weathers (empty: all)
    carry_share: float = 0.0  # self-rollout steps whose static ground targets the model's own frame moved
    adv_weight: float = 0.0  # adversarial term on the x0 guesses (``training/critic.py``; 0: no critic)
    adv_warmup: int = 100  # steps of this run the critic trains alone, then as many ramping the term in
    adv_lr: float = 2e-4  # the critic's learning rate (Adam, betas 0, 0.99)
    texture_weight: float = 0.0  # feature statistics of the x0 guesses against the renderer's (``training/texture.py``)
    # batches whose references are the ground through the tokenizer (``training/canvas_refs.py``)
    canvas_share: float = 0.0
    bank_share: float = 0.0  # steps that train on the model's own long rollouts (``training/bank.py``)
    bank_life: int = 800  # frames a bank session lives at most (each a random life up to it)
    bank_advance: int = 2  # frames every bank session moves on per training step
    restart_schedule: bool = False  # on resume: warm up again and plan a new cosine
    init_weights: str = ""  # with no checkpoint in --out: start model and EMA from these servable weights
    worlds: int = 16  # worlds kept in memory; one is rebuilt every ``world_refresh`` steps
    map_size: int = DEFAULT_MAP_SIZE  # world side in world units (tests use small maps)
    world_refresh: int = 40
    checkpoint_minutes: float = 5.0
    seed: int = 0
    threads: int = 0  # 0: torch's default
    device: str = "cpu"  # "cuda" trains on a GPU (TF32 matmuls); the data stays on the CPU
    data_workers: int = 0  # processes recording batches (0: in the training process)
    model: dict = field(default_factory=dict)  # ModelConfig overrides


# ---------------------------------------------------------------------------- data


def positions(length: int, far: bool, cfg: ModelConfig) -> list[int]:
    if not far:
        return list(range(length))
    offset = cfg.sink_frames + cfg.window_frames + 50
    return [0, *range(offset, offset + length - 1)]


# ---------------------------------------------------------------------------- self-rollout


@torch.no_grad()
def self_rollout(
    model: WorldModel, x: torch.Tensor, gt_prev: torch.Tensor, actions: torch.Tensor,
    scene: torch.Tensor, pos: list[int], g: torch.Generator,
    anchor: tuple[int, torch.Tensor, torch.Tensor], refs: torch.Tensor | None = None,
) -> torch.Tensor:
    # scene: (B, N, S) per frame
    """The model's own frames for positions 1.. of each sequence (frame 0 is given), with the
    cached inference path and the full step count; returns (B, N, C, H, W) quantized. A frame
    whose position does not follow its predecessor's keeps its true previous frame.
    ``anchor``: the anchor's index, offsets (B, N, 2) and valid
    (B, N); the reference is made from the rollout's own anchor frame, unless ``refs``
    (B, N, C + 1, H, W) gives every frame's (a world canvas's)."""
    cfg = model.cfg
    b, n, c, h, w = x.shape
    out = x.clone()
    pool = KVCachePool.create(cfg, h, b, model.rope, device=x.device)
    slots = [pool.allocate() for _ in range(b)]
    levels = cfg.noise_levels()
    prev = gt_prev[:, :1]
    for i in range(n):
        if i > 0 and pos[i] != pos[i - 1] + 1:
            prev = gt_prev[:, i : i + 1]
        ctx = pool.context(slots, np.full(b, pos[i]))
        a, sc = actions[:, i : i + 1], scene[:, i]
        first, offsets, valid = anchor
        if refs is not None:
            ref = refs[:, i]
        else:
            ref = (anchor_reference(out[:, first], offsets[:, i], valid[:, i]) if i > first
                   else prev.new_zeros(b, c + 1, h, w))
        prev = torch.cat((prev[:, :, :c], ref[:, None]), 2)
        if i > 0:
            xt = randn((b, 1, c, h, w), g)
            x0 = xt
            for k, t in enumerate(levels):
                x0 = model.denoise_chunk(xt, prev, t, a, sc, ctx).clamp(-1, 1)
                if k + 1 < len(levels):
                    xt = next_noisy(xt, x0, t, levels[k + 1], randn(x0.shape, g), ROLLOUT_ETA)
            out[:, i : i + 1] = WorldModel.encode(WorldModel.decode(x0))
        kv = model.commit_chunk(out[:, i : i + 1], prev, a, sc, ctx)
        pool.commit(slots, np.full((b, 1), pos[i]), *kv)
        prev = out[:, i : i + 1]
    return out


# ---------------------------------------------------------------------------- the step


def train_step(
    model: WorldModel, batch: dict[str, np.ndarray], cfg: ModelConfig, g: torch.Generator,
    use_rollout: bool, edge_weight: float = 0.0, motion_weight: float = 0.0, rollout_lead: int = 0,
    motion_weathers: tuple[str, ...] = (), carry: bool = False,
    adversary: Adversary | None = None, adv_weight: float = 0.0,
    texture: TextureLoss | None = None, texture_weight: float = 0.0,
    canvas: CanvasReferences | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one batch on the model's device (``g`` draws the noise there), and
    statistics as 0-d tensors: reading them back is the caller's choice (a GPU sync).

    ``rollout_lead``: on a self-rollout step, the model runs that many frames past the
    sink before the frames it is trained on, which keep only the sink before them: the
    trained frames start from a rollout that has already drifted as far as a session's does
    after ``rollout_lead`` frames. Other steps train on the sequence minus those frames.

    A batch from the rollout bank (it has ``truth``: the model's own long rollout beside the
    renderer's frames) trains on the model's frames as context, with its own previous frame
    moved by the camera as the target where the renderer's frame is its previous one moved
    (``carry_mask``; the frame loss counts nowhere else) and the critic elsewhere (no lead:
    the whole sequence already follows a long rollout).

    ``adversary``: the critic judges the x0 guesses against the renderer's frames; its term
    enters the loss at ``adv_weight`` (0 while the critic warms up) and
    reaches only the pixels the anchor reference does not cover; the caller runs
    ``adversary.critic_step()`` after the model's update. ``texture``: the guesses' feature
    statistics against the renderer's frames, at ``texture_weight``, with the critic's reach.

    A batch with ``grounds`` (every frame's ground alone) takes its references from ``canvas``
    (``training/canvas_refs.py``: the ground through the ground tokenizer, as a world canvas
    serves it) instead of the sequence's anchor."""
    dev = next(model.parameters()).device
    put = lambda a: torch.from_numpy(a).to(dev, non_blocking=True)  # noqa: E731
    enc = WorldModel.encode
    x = enc(put(batch["frames"]))  # (B, N, C, H, W)
    prev = enc(put(batch["prevs"]))
    prev[:, 0] = 0.0  # frame 0 starts the epoch: there is no previous frame
    actions = put(batch["actions"])
    scene = put(batch["scenes"])
    b, n = x.shape[:2]
    stats: dict[str, torch.Tensor] = {}
    far = bool(batch["far"])  # one layout per step: the mask is shared by the batch
    pos = positions(n, far, cfg)
    ctx_frames, ctx_prev = x, prev
    k = 1 if far else 0  # the anchor: frame 0, or after a far sink the first frame that follows it
    offsets, valid = anchor_offsets(batch["actions"], batch["scenes"], k, x.shape[-1])
    anchor = (k, put(offsets.astype(np.float32)), put(valid))
    refs = None
    if "grounds" in batch:
        if canvas is None:
            raise ValueError("a batch with grounds needs the canvas references' tokenizer")
        refs = canvas(batch["grounds"], batch["scenes"]).to(x.dtype)
        stats["canvas"] = x.new_ones(())
        if "states" in batch:  # the live state's channels after the reference (``training/live.py``)
            refs = torch.cat((refs, put(batch["states"]).to(x.dtype)), 2)
    if use_rollout:
        model.eval()
        gen = self_rollout(model, x, prev, actions, scene, pos, g, anchor, refs)
        model.train()
        ctx_frames = gen
        ctx_prev = torch.cat((prev[:, :1], gen[:, :-1]), 1)
        if far:  # the first frame after the far sink follows an unseen frame: keep the truth
            ctx_prev[:, 1] = prev[:, 1]
        stats["rollout_mse"] = F.mse_loss(gen[:, 1:], x[:, 1:]).detach()
    # every frame's reference, from the context's own anchor frame (or the canvas)
    ctx_prev = torch.cat((ctx_prev, sequence_references(ctx_frames, *anchor) if refs is None else refs), 2)
    if ctx_prev.shape[2] < cfg.prev_channels:  # a batch without a live state: its channels are zero
        ctx_prev = F.pad(ctx_prev, (0, 0, 0, 0, 0, cfg.prev_channels - ctx_prev.shape[2]))
    if rollout_lead and n > 1 + rollout_lead and "truth" not in batch:  # keep the sink and the frames after the lead
        keep = [0, *range(1 + rollout_lead, n)]
        x, prev, actions, scene = x[:, keep], prev[:, keep], actions[:, keep], scene[:, keep]
        ctx_frames, ctx_prev = ctx_frames[:, keep], ctx_prev[:, keep]
        pos = [pos[i] for i in keep]
        batch = {**batch, "actions": batch["actions"][:, keep], "scenes": batch["scenes"][:, keep]}
        n = len(keep)
    real = x  # the renderer's frames, whatever the targets become
    pix_weight = put(batch["weights"])[:, :, None] if "weights" in batch else None  # (B, N, 1, H, W)
    if "truth" in batch:  # the bank: carry what the model drew where the camera alone explains the renderer
        real = enc(put(batch["truth"]))
        shifts = carry_shifts(batch["actions"], batch["scenes"], pos, x.shape[-1])
        static = carry_mask(real, enc(put(batch["truth_prevs"])), shifts)
        x = torch.where(static[:, :, None], moved_frames(ctx_prev[:, :, : cfg.channels], shifts), x)
        pix_weight = static[:, :, None].float()
        pix_weight[:, 0] = 1.0  # the sink is the renderer's own frame
        stats["bank_carried"] = static[:, 1:].float().mean()
    if carry and use_rollout:  # static ground: carry the model's own previous frame, not the truth
        shifts = carry_shifts(batch["actions"], batch["scenes"], pos, x.shape[-1])
        x, stats["carried"] = carry_targets(x, prev, ctx_prev[:, :, : cfg.channels], shifts)
    t = noise_levels((b, n), cfg, g)
    noisy = noised(x, t[..., None, None, None], randn(x.shape, g))
    seq = torch.cat((ctx_frames, noisy), 1)
    seq_prev = torch.cat((ctx_prev, ctx_prev), 1)
    seq_noise = torch.cat((t.new_zeros(b, n), t), 1)  # the context is clean
    seq_act = torch.cat((actions, actions), 1)
    seq_scene = torch.cat((scene, scene), 1)
    seq_pos = torch.tensor(pos + pos)
    flags = torch.cat((torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)))
    kernels: list[torch.Tensor] | None = [] if motion_weight > 0 else None
    out, _ = model.forward_sequence(seq, seq_prev, seq_noise, seq_act, seq_scene, seq_pos, flags, kernels=kernels)
    pred = out[:, n:]
    if pix_weight is None:
        loss = F.mse_loss(pred, x)
    else:
        loss = masked_mse(pred, x, pix_weight)
    if edge_weight > 0 and pix_weight is None:  # sharp guesses matter most at the low noise levels that make the output
        edges = edge_loss(pred, x, 1.0 - t)
        stats["edge"] = edges.detach()
        loss = loss + edge_weight * edges
    if kernels:  # the noisy half's kernels against the commanded camera shift
        h = x.shape[-1]
        targets = put(shift_targets(batch["actions"], h, cfg.radius(h)))
        kern = kernels[0].view(b, 2 * n, *kernels[0].shape[1:])[:, n:].reshape(b * n, *kernels[0].shape[1:])
        w = (1.0 - t).clone()
        w[:, 0] = 0.0  # frame 0 has no previous frame to move
        if motion_weathers:
            w = w * put(weather_mask(batch["scenes"], motion_weathers))
        motion = motion_loss(kern, targets, w)
        stats["motion"] = motion.detach()
        loss = loss + motion_weight * motion
    reach = 1.0 - ctx_prev[:, :, cfg.channels : cfg.channels + 1]  # what the anchor does not show
    if texture is not None and texture_weight > 0:  # made of what the world is made of, wherever placed
        tex = texture.loss(pred, real, g, reach)
        stats["texture"] = tex.detach()
        loss = loss + texture_weight * tex
    if adversary is not None:  # a plausible frame, not the mean of them, at every noise level
        adv = adversary.generator_loss(pred, real, scene, g, reach)
        stats["adv"] = adv.detach()
        if adv_weight > 0:
            loss = loss + adv_weight * adv
    base = cfg.base_bucket  # the model's own camera shift per action, for serving's references
    want = put(camera_shifts(batch["actions"], base).astype(np.float32))
    shift_err = F.mse_loss(model.camera_shift(actions, base), want)
    stats["shift_err"] = shift_err.detach()
    loss = loss + SHIFT_WEIGHT * shift_err
    with torch.no_grad():
        err = ((pred - x) ** 2).mean(dim=(2, 3, 4))
        for name, lo, hi in (("lo", 0.0, 0.4), ("hi", 0.4, 1.01)):
            sel = ((t >= lo) & (t < hi)).float()
            stats[f"mse_{name}"] = (err * sel).sum() / sel.sum()  # NaN when no frame fell there
    return loss, stats


# ---------------------------------------------------------------------------- loop


def progress(step: int, elapsed: float, budget: float, loss: float, stats: dict[str, float]) -> None:
    frac = min(1.0, elapsed / budget)
    bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
    extra = " ".join(f"{k}={v:.4f}" for k, v in sorted(stats.items()))
    sys.stderr.write(f"\r[{bar}] step {step} {elapsed / 60:5.1f}/{budget / 60:.0f} min loss={loss:.4f} {extra}   ")
    sys.stderr.flush()


def train(tc: TrainConfig, resume: bool, export: Path | None) -> dict:
    tune_malloc()
    if tc.threads:
        torch.set_num_threads(tc.threads)
    device = torch.device(tc.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out = Path(tc.out)
    out.mkdir(parents=True, exist_ok=True)
    if tc.model:
        cfg = ModelConfig.from_dict(tc.model)
    elif tc.init_weights:  # the config the weights were served with
        cfg = ModelConfig.from_json(config_path(Path(tc.init_weights).with_suffix(".safetensors")).read_text())
    else:
        cfg = ModelConfig()
    torch.manual_seed(tc.seed)
    model, ema = WorldModel(cfg), WorldModel(cfg)
    ema.load_state_dict(model.state_dict())
    model.to(device)
    ema.to(device).requires_grad_(False)
    fresh: frozenset[str] = frozenset()
    if resume and (out / "ckpt.safetensors").exists():
        with safe_open(str(out / "ckpt.safetensors"), "pt") as f:
            saved = {k[6:] for k in f.keys() if k.startswith("model.")}
            fresh = frozenset(n for n, _ in model.named_parameters()) - saved
    if tc.train_only:
        freeze_except(model, tc.train_only)
    opt = make_optimizer(model, tc, fresh)
    adversary = Adversary(cfg.channels, cfg.scene_dim, tc.adv_lr, device=device) if tc.adv_weight > 0 else None
    texture = TextureLoss(cfg.channels, device=device) if tc.texture_weight > 0 else None
    meta = {"step": 0, "cpu_seconds": 0.0, "wall_seconds": 0.0, "history": [],
            "model": json.loads(cfg.to_json())}
    if resume and (out / "ckpt.safetensors").exists():
        meta = load_checkpoint(out, model, ema, opt, adversary)
        print(f"resumed from {out} at step {meta['step']}", file=sys.stderr)
        meta["model"] = json.loads(cfg.to_json())  # what this run trains (and exports)
        if tc.restart_schedule:
            meta.pop("planned_steps", None)
            meta["schedule_start"] = meta["step"]
    elif tc.init_weights:  # a fine-tune of served weights where their checkpoint is not at hand
        meta["step"] = meta["schedule_start"] = init_from_weights(model, ema, Path(tc.init_weights))
        print(f"started from {tc.init_weights} (step {meta['step']}, fresh optimizer)", file=sys.stderr)
    if not resume or any(n.startswith("shift_head.") for n in fresh):
        for m in (model, ema):  # a new shift head starts solved: references are served from it
            fit_shift_head(m)
    if tc.train_only:
        hold_at_ema(model, ema)
    step0 = meta["step"]
    sched0 = int(meta.get("schedule_start", 0))
    bank = None
    if tc.bank_share > 0:  # the EMA weights' own long rollouts, the weights that are served
        bank = RolloutBank(ema, tc.batch, cfg.buckets[0], tc.seq_frames, tc.bank_life,
                           np.random.default_rng([tc.seed, step0, 2]), tc.map_size, warm_frames=tc.bank_life // 4)
    rng = np.random.default_rng([tc.seed, step0, 1])  # self-rollout draws; batches have their own
    g = torch.Generator(device).manual_seed(tc.seed * 1_000_003 + step0)
    base_tokens = cfg.tokens_per_frame(cfg.buckets[0])
    spec = DataSpec(
        buckets=cfg.buckets,
        sequences={b: max(2, tc.batch // (cfg.tokens_per_frame(b) // base_tokens)) for b in cfg.buckets},
        seq_frames=tc.seq_frames, big_bucket_every=tc.big_bucket_every, far_sink_share=tc.far_sink_share,
        scene_switch_share=tc.scene_switch_share, still_share=tc.still_share, worlds=tc.worlds,
        map_size=tc.map_size, world_refresh=tc.world_refresh, canvas_share=tc.canvas_share,
    )
    canvas = CanvasReferences.load(device) if tc.canvas_share > 0 else None
    params, ema_params = list(model.parameters()), list(ema.parameters())
    budget = tc.minutes * 60
    with BatchSource(spec, tc.seed, step0, tc.data_workers) as source:
        t_start, cpu_start = time.perf_counter(), time.process_time()
        last_ckpt = t_start
        # the cosine schedule spans the whole planned run, resumes included
        total = max(step0 + 1, int(meta.get("planned_steps", 0)) or tc.max_steps)
        step, losses, t_first = step0, [], 0.0
        model.train()
        while step < tc.max_steps:
            now = time.perf_counter()
            elapsed = now - t_start
            if elapsed >= budget:
                break
            if step == step0 + 1:  # the first step waits for the recorders' worlds: not the pace
                t_first = now
            if step > step0 + 20 and "planned_steps" not in meta:
                rate = (step - step0 - 1) / (now - t_first)
                meta["planned_steps"] = total = int(step + rate * (budget - elapsed) * 1.02)
            from_bank = bank is not None and rng.random() < tc.bank_share
            if bank is not None:
                bank.advance(tc.bank_advance)
            batch = bank.batch() if from_bank else source.batch(step)
            use_rollout = (not from_bank and step >= tc.self_rollout_after
                           and rng.random() < tc.self_rollout_share)
            for grp in opt.param_groups:
                grp["lr"] = lr_at(step, tc, total, sched0) * grp["scale"]
            carry = use_rollout and tc.carry_share > 0 and rng.random() < tc.carry_share
            loss, stat_t = train_step(model, batch, cfg, g, use_rollout, tc.edge_weight, tc.motion_weight,
                                      tc.rollout_lead, tc.motion_weathers, carry, adversary,
                                      adv_ramp(step - step0, tc) * tc.adv_weight, texture, tc.texture_weight,
                                      canvas)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            if adversary is not None:
                stat_t.update(adversary.critic_step())
            with torch.no_grad():
                d = min(tc.ema, (1 + step) / (10 + step))
                torch._foreach_lerp_(ema_params, params, 1 - d)
            losses.append(loss.item())
            stats = {k: v for k, v in ((k, float(v)) for k, v in stat_t.items()) if math.isfinite(v)}
            step += 1
            progress(step, time.perf_counter() - t_start, budget, float(np.mean(losses[-50:])), stats)
            if step % 100 == 0:
                meta["history"].append({"step": step, "loss": float(np.mean(losses[-100:])), **stats})
            if time.perf_counter() - last_ckpt > tc.checkpoint_minutes * 60:
                _save(out, model, ema, opt, meta, step, t_start, cpu_start, adversary)
                last_ckpt = time.perf_counter()
        _save(out, model, ema, opt, meta, step, t_start, cpu_start, adversary)
    sys.stderr.write("\n")
    report = {
        "steps": step, "steps_this_run": step - step0,
        "loss_last_100": float(np.mean(losses[-100:])) if losses else None,
        "loss_first_10_this_run": float(np.mean(losses[:10])) if losses else None,
        "loss_last_10_this_run": float(np.mean(losses[-10:])) if losses else None,
        "cpu_seconds_total": meta["cpu_seconds"], "wall_seconds_total": meta["wall_seconds"],
        "threads": torch.get_num_threads(), "device": str(device), "config": asdict(tc),
        "model": json.loads(cfg.to_json()),
    }
    atomic.write_text(out / "report.json", json.dumps(report, indent=2))
    if export is not None:
        fit_shift_head(ema)
        save_model(ema, export, metadata={"steps": str(step)})
        atomic.write_text(Path(export).with_suffix(".report.json"), json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k not in ("config", "model")}, indent=2))
    return report


def _save(out: Path, model: WorldModel, ema: WorldModel, opt: torch.optim.Optimizer, meta: dict,
          step: int, t_start: float, cpu_start: float, adversary: Adversary | None = None) -> None:
    now_wall, now_cpu = time.perf_counter(), time.process_time()
    meta["cpu_seconds"] = meta.get("cpu_seconds", 0.0) + (now_cpu - meta.pop("_cpu_mark", cpu_start))
    meta["wall_seconds"] = meta.get("wall_seconds", 0.0) + (now_wall - meta.pop("_wall_mark", t_start))
    meta["_cpu_mark"], meta["_wall_mark"] = now_cpu, now_wall
    meta["step"] = step
    save_checkpoint(out, model, ema, opt, {k: v for k, v in meta.items() if not k.startswith("_")}, adversary)


OPTION_HELP = {  # TrainConfig fields whose flag says more than its name
    "rollout_lead": "frames of self-rollout before the trained frames (the sequence holds them too)",
    "new_module_lr_scale": "learning-rate factor for modules new to the checkpoint (e.g. anchor_heads)",
    "train_only": "comma-separated parameter-name prefixes to train (e.g. anchor_heads.); the rest stays frozen",
    "still_share": "share of sequences with long still stretches (the calm policy)",
    "motion_weight": "cross-entropy of the motion kernels against the commanded camera shift",
    "motion_weathers": "comma-separated weathers the motion term is limited to (e.g. snowfall,rain)",
    "carry_share": "share of self-rollout steps whose static ground targets the model's own frame moved",
    "adv_weight": "adversarial term on the x0 guesses against a patch critic (0: off)",
    "adv_warmup": "steps the critic trains alone, then as many ramping the term in",
    "texture_weight": "feature statistics of the x0 guesses against the renderer's frames (0: off)",
    "canvas_share": "share of steps whose references are the ground through the ground tokenizer (a world canvas's)",
    "bank_share": "share of steps on the model's own long rollouts (carried ground + critic)",
    "bank_life": "frames a bank session lives at most",
    "bank_advance": "frames every bank session moves on per training step",
    "restart_schedule": "on --resume: warm up again and plan a new cosine over this run",
    "init_weights": "with no checkpoint in --out: start model and EMA from these servable weights "
                    "(fresh optimizer, the schedule restarted)",
    "threads": "torch threads (0: torch's default)",
    "device": "cpu or cuda",
    "data_workers": "processes recording batches (a GPU needs several)",
    "model": "JSON of ModelConfig overrides",
}


def _words(text: str) -> tuple[str, ...]:
    return tuple(w for w in text.split(",") if w)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the world model on the procedural world.")
    defaults = TrainConfig()
    for f in fields(TrainConfig):  # one flag per field: --seq-frames for seq_frames
        flag, default, help_ = "--" + f.name.replace("_", "-"), getattr(defaults, f.name), OPTION_HELP.get(f.name)
        if isinstance(default, bool):
            ap.add_argument(flag, action="store_true", help=help_)
        elif isinstance(default, tuple):  # comma-separated words
            ap.add_argument(flag, type=_words, default=default, help=help_)
        elif isinstance(default, dict):  # JSON
            ap.add_argument(flag, type=json.loads, default=default, help=help_)
        else:
            ap.add_argument(flag, type=type(default), default=default, help=help_)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--export", type=Path, default=None, help="write EMA weights here (.safetensors + .json)")
    ap.add_argument("--export-only", action="store_true", help="export the checkpoint in --out to --export and stop")
    ap.add_argument("--sampler", type=json.loads, default=None,
                    help="with --export-only: JSON of sampler settings for the exported config, "
                         'e.g. \'{"sampler_eta": 0}\'')
    args = ap.parse_args(argv)
    if args.export_only:
        if args.export is None:
            ap.error("--export-only needs --export")
        print(export_checkpoint(Path(args.out), args.export, args.sampler))
        return
    train(TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)}), args.resume, args.export)


if __name__ == "__main__":
    main()
