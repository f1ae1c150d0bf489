"""The training step's extra targets and terms, beside the frame loss (``training/train.py``).

- ``edge_loss``: image-gradient matching, against blur;
- ``shift_targets`` / ``motion_loss``: the motion kernel the commanded camera shift asks for,
  and a cross-entropy pulling the warp's kernels toward it; ``weather_mask`` limits it to
  frames of some weathers;
- ``carry_shifts`` / ``carry_targets``: on self-rollout steps, the static ground the model
  already drew targets its own previous frame moved by the camera, not the renderer's.
"""

from __future__ import annotations

import numpy as np
import torch

from worldserve.model.default.net.config import ModelConfig
from worldserve.world import ATTRIBUTES, expected_shift


def edge_loss(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Image-gradient matching (L1 between gradient magnitudes, along x and y), per frame
    weighted: a clean-sample regressor that averages what it cannot know loses edges,
    and this term charges for the lost edges where MSE barely does."""
    total = pred.new_zeros(())
    for dim in (-1, -2):
        gp, gt = pred.diff(dim=dim).abs(), target.diff(dim=dim).abs()
        total = total + ((gp - gt).abs().mean(dim=(2, 3, 4)) * weight).mean()
    return total


def camera_shifts(actions: np.ndarray, bucket: int) -> np.ndarray:
    """The static scene's pixel shift (dy, dx) under every action: (B, N, A) -> (B, N, 2)."""
    return np.array([[expected_shift(a, bucket) for a in seq] for seq in actions], np.float64).reshape(
        *actions.shape[:2], 2
    )


def shift_targets(actions: np.ndarray, bucket: int, radius: int) -> np.ndarray:
    """The motion kernel the camera asks for, per frame: actions (B, N, A) -> (B, N, 2, taps)
    weights over offsets -radius..radius, y then x. The static scene moves by d pixels
    (``expected_shift``), so the warp must read the previous frame at offset -d; a
    fractional d splits its weight between the two nearest offsets."""
    shifts = camera_shifts(actions, bucket)
    b, n, _ = actions.shape
    taps = 2 * radius + 1
    out = np.zeros((b, n, 2, taps), np.float32)
    pos = np.clip(radius - shifts, 0, taps - 1)
    lo = np.floor(pos).astype(int)
    frac = (pos - lo).astype(np.float32)
    ii, jj, aa = np.indices((b, n, 2))
    np.add.at(out, (ii, jj, aa, lo), 1 - frac)
    np.add.at(out, (ii, jj, aa, np.minimum(lo + 1, taps - 1)), frac)  # frac is 0 where lo is the last tap
    return out


def motion_loss(kernels: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every token's kernels (B*N, gh, gw, 2, taps) against the camera's
    (B, N, 2, taps), per frame weighted (B, N). Things that move on their own disagree with
    the camera; a small weight lets the frame loss overrule it there."""
    b, n = weight.shape
    logp = kernels.clamp_min(1e-6).log().view(b, n, -1, 2, kernels.shape[-1])
    ce = -(targets[:, :, None] * logp).sum(-1).mean(dim=(2, 3))  # (B, N)
    return (ce * weight).mean()


CARRY_TOLERANCE = 0.03  # in [-1, 1] units (~4 of 255): a pixel the camera's shift alone explains


def carry_targets(
    x: torch.Tensor, true_prev: torch.Tensor, own_prev: torch.Tensor, shifts: np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets for frames that follow the model's own frames: where the true frame is only
    the true previous frame moved by the camera (static ground, seen before), the target is
    the model's own previous frame moved the same way; elsewhere (new terrain at the edge,
    actors, falling snow, frames whose shift is not a whole number of pixels) the truth.

    A frame generated from a drifted, softened previous frame cannot get the truth's detail
    back, and asking it to teaches the warp to hedge: to blur. This asks it to carry what it
    has, exactly. x, true_prev, own_prev (B, N, C, H, W); shifts (B, N, 2) pixels (dy, dx),
    NaN where the frame has no previous frame. Returns the targets and the share of pixels
    that took the carried value (a 0-d tensor: no device sync per frame)."""
    static = carry_mask(x, true_prev, shifts)
    return torch.where(static[:, :, None], moved_frames(own_prev, shifts), x), static.double().mean()


def sampled_guesses(
    pred: torch.Tensor, real: torch.Tensor, g: torch.Generator, frames: int, reach: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The frames a judge of the x0 guesses sees: pred, real (B, N, C, H, W) flattened to
    frames and a random subset of at most ``frames`` of them (drawn from ``g``; bounds the
    judge's cost), as (guesses, real frames detached, their indices). ``reach`` (B, N, 1, H,
    W) in [0, 1] limits where the guesses' gradient goes; their values are unchanged, so the
    judge still sees the whole frame."""
    fake, real = pred.flatten(0, 1), real.flatten(0, 1)
    idx = torch.randperm(fake.shape[0], generator=g, device=g.device)[:frames]
    fake, real = fake[idx], real[idx].detach()
    if reach is not None:
        r = reach.flatten(0, 1)[idx].to(fake.dtype)
        fake = fake * r + fake.detach() * (1 - r)
    return fake, real, idx


def masked_mse(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Squared error averaged over the pixels of weight 1 only: pred, target (B, N, C, H, W),
    weight (B, N, 1, H, W) in {0, 1}; 0 where no pixel counts."""
    return ((pred - target) ** 2 * weight).sum() / (weight.sum() * pred.shape[2]).clamp_min(1.0)


def carry_mask(x: torch.Tensor, true_prev: torch.Tensor, shifts: np.ndarray) -> torch.Tensor:
    """(B, N, H, W) bool: where the true frame x is only the true previous frame moved by
    the frame's whole-pixel camera shift (static ground seen before; ``carry_targets``).
    False everywhere in a frame whose shift is NaN or not a whole number of pixels."""
    b, n, _, h, w = x.shape
    out = torch.zeros(b, n, h, w, dtype=torch.bool, device=x.device)
    for i in range(b):
        for j in range(n):
            d = _whole_shift(shifts[i, j], h, w)
            if d is None:
                continue
            dy, dx = d
            moved_true = torch.roll(true_prev[i, j], (dy, dx), (1, 2))
            static = (x[i, j] - moved_true).abs().amax(0) < CARRY_TOLERANCE
            out[i, j, max(0, dy) : h + min(0, dy), max(0, dx) : w + min(0, dx)] = static[
                max(0, dy) : h + min(0, dy), max(0, dx) : w + min(0, dx)]
    return out


def moved_frames(frames: torch.Tensor, shifts: np.ndarray) -> torch.Tensor:
    """frames (B, N, C, H, W) each moved by its whole-pixel shift (wrapping; only the part
    ``carry_mask`` keeps is used); frames without a whole shift stay as they are."""
    out = frames.clone()
    h, w = frames.shape[-2:]
    for i in range(frames.shape[0]):
        for j in range(frames.shape[1]):
            d = _whole_shift(shifts[i, j], h, w)
            if d is not None:
                out[i, j] = torch.roll(frames[i, j], d, (1, 2))
    return out


def _whole_shift(d: np.ndarray, h: int, w: int) -> tuple[int, int] | None:
    if not np.all(np.isfinite(d)) or np.any(np.abs(d - np.round(d)) > 1e-3):
        return None
    dy, dx = (int(np.rint(v)) for v in d)
    if abs(dy) >= h or abs(dx) >= w:
        return None
    return dy, dx


def prompt_changed(scenes: np.ndarray) -> np.ndarray:
    """(B, N-1) bool: frames 1.. of each sequence from its first prompt change on, scenes
    (B, N, S) the frames' scene vectors."""
    return np.cumsum(np.any(scenes[:, 1:] != scenes[:, :-1], axis=-1), axis=1) > 0


def carry_shifts(actions: np.ndarray, scenes: np.ndarray, pos: list[int], bucket: int) -> np.ndarray:
    """The camera shift (dy, dx) in pixels of every frame of a sequence, (B, N, 2), NaN where
    a frame must keep the truth as its target: frame 0 (nothing before it), a frame that
    follows an unseen frame (the far sink), and every frame from a prompt change on (it
    must re-colour toward the new scene, not carry the old one)."""
    shifts = camera_shifts(actions, bucket)
    shifts[:, 0] = np.nan
    for j in range(1, len(pos)):
        if pos[j] != pos[j - 1] + 1:
            shifts[:, j] = np.nan
    changed = prompt_changed(scenes)
    shifts[:, 1:][changed] = np.nan
    return shifts


def weather_mask(scenes: np.ndarray, weathers: tuple[str, ...]) -> np.ndarray:
    """(B, N) float32: 1 where a frame's scene vector (B, N, S) has one of ``weathers``."""
    names = ATTRIBUTES["weather"]
    unknown = [w for w in weathers if w not in names]
    if unknown:
        raise ValueError(f"unknown weather {unknown}; one of {list(names)}")
    order = list(ATTRIBUTES)
    start = sum(len(ATTRIBUTES[k]) for k in order[: order.index("weather")])
    block = np.asarray(scenes)[..., start : start + len(names)].argmax(-1)
    return np.isin(block, [names.index(w) for w in weathers]).astype(np.float32)


def anchor_offsets(actions: np.ndarray, scenes: np.ndarray, anchor: int, bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each frame of a sequence sees its anchor (frame ``anchor``, the sequence's first
    frame that follows the frame before it): the camera shift summed since the anchor,
    (B, N, 2) pixels, and whether the reference is usable, (B, N) bool: only for frames after
    the anchor, and not from a prompt change on (the anchor's colours belong to the old
    scene)."""
    shifts = camera_shifts(actions, bucket)
    b, n, _ = shifts.shape
    shifts[:, : anchor + 1] = 0.0
    offsets = np.cumsum(shifts, axis=1)
    valid = np.zeros((b, n), bool)
    valid[:, anchor + 1 :] = True
    changed = prompt_changed(scenes)
    valid[:, 1:] &= ~changed
    return offsets, valid


def fit_shift_head(model: torch.nn.Module) -> float:
    """Solve the model's shift head (a linear map from the action to the
    static scene's shift at the base bucket) in closed form: least squares over every key
    combination and a grid of mouse deltas against the commanded shift. The map is linear
    in the action inside its ranges, so this is the optimum its training term seeks, without
    the hundreds of steps Adam takes to get there. Returns the RMS error left, in pixels."""
    from worldserve.protocol.vocab import KEYS

    keys = np.array(np.meshgrid(*[[0.0, 1.0]] * len(KEYS), indexing="ij")).reshape(len(KEYS), -1).T
    mouse = np.array(np.meshgrid(*[np.linspace(-1, 1, 9)] * 2, indexing="ij")).reshape(2, -1).T
    acts = np.concatenate((np.repeat(keys, len(mouse), 0), np.tile(mouse, (len(keys), 1))), 1)
    head = model.shift_head
    base = model.cfg.base_bucket
    want = camera_shifts(acts[None], base)[0]  # (M, 2)
    design = np.concatenate((acts, np.ones((len(acts), 1))), 1)
    sol, *_ = np.linalg.lstsq(design, want, rcond=None)  # (A + 1, 2)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(sol[:-1].T.copy()))
        head.bias.copy_(torch.from_numpy(sol[-1].copy()))
    return float(np.sqrt(((design @ sol - want) ** 2).mean()))


def noise_levels(shape: tuple[int, ...], cfg: ModelConfig, g: torch.Generator) -> torch.Tensor:
    """Half from the sampler's schedules (every step count), half uniform in (0, 1]."""
    dev = g.device
    sched = torch.tensor(sorted({t for n in range(cfg.min_steps, cfg.denoising_steps + 1)
                                 for t in cfg.noise_levels(n)}), device=dev)
    pick = sched[torch.randint(len(sched), shape, generator=g, device=dev)]
    uni = torch.rand(shape, generator=g, device=dev).clamp_min(0.02)
    return torch.where(torch.rand(shape, generator=g, device=dev) < 0.5, pick, uni)


def randn(shape: torch.Size | tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Standard normal noise on the generator's device."""
    return torch.randn(shape, generator=g, device=g.device)
