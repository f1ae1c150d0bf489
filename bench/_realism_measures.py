"""Measures of whether a set of frames looks like the world: ``bench.realism``'s three tests.

Frames are (N, H, W, 3) uint8 throughout.

- ``c2st_accuracy``: a classifier two-sample test. Small convolutional networks, trained
  afresh with a fixed seed, learn to tell set ``a`` from set ``b``; their accuracy on frames of
  held-out worlds (cross-fitted: each world judged by a network that never saw it) is the
  result: 0.5 when the sets cannot be told apart, 1.0 when they always can. Such a test is
  only as good as its classifier, so the bench runs the same recipe on the renderer's frames
  against ``blur4`` copies of them as a control.
- ``frechet_distance``: the Frechet distance between two Gaussians fitted to feature sets
  (the FID formula, on the features of ``bench._scene_features``).
- ``patch_distance``: the mean distance of every 8x8 patch of some frames to its nearest patch
  in a bank of the world's frames, by what the patches are made of (colour, contrast, edge
  strength); a ratio of two of them is ``bench.realism``'s patch realism.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def blur4(frames: np.ndarray) -> np.ndarray:
    """The frames with 4x less detail: each 4x4 block averaged, then bilinearly upsampled back
    to full size (the control for ``c2st_accuracy``)."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()  # (N, 3, H, W)
    small = F.avg_pool2d(x, 4)  # (N, 3, H/4, W/4)
    big = F.interpolate(small, size=x.shape[-2:], mode="bilinear", align_corners=False)
    return big.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def blocky(frames: np.ndarray, block: int = 16) -> np.ndarray:
    """Each ``block`` x ``block`` square of the frames replaced by its mean colour (what a head
    that writes each token as one flat colour draws)."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    big = F.interpolate(F.avg_pool2d(x, block), scale_factor=block, mode="nearest")
    return big.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def to_input(frames: np.ndarray) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 127.5 - 1


# -- the two-sample test ---------------------------------------------------------------------


@dataclass(frozen=True)
class C2STConfig:
    widths: tuple[int, ...] = (16, 32, 64, 64)  # channels per conv; every one after the first halves H, W
    crop: int = 32  # training crops (px, random place); the test sees whole frames
    epochs: int = 16  # passes over the training frames
    batch: int = 32
    lr: float = 2e-3  # Adam, cosine decay to 0
    seed: int = 0
    # classifiers per fold, from seeds seed, seed + 1, ...: their accuracies averaged. One
    # classifier's reading moved by up to 0.17 with its seed on the same frames (0.629 / 0.804
    # / 0.691 at 10 s for the served canvas over 32 worlds), more than most changes it judges
    repeats: int = 3

    def __post_init__(self) -> None:
        if not self.widths or min(self.widths) < 1:
            raise ValueError(f"widths {self.widths} must be a non-empty tuple of positive ints")
        if self.crop < 8 or self.epochs < 1 or self.batch < 2 or self.lr <= 0 or self.repeats < 1:
            raise ValueError(f"bad C2STConfig: crop={self.crop} epochs={self.epochs} batch={self.batch} lr={self.lr} "
                             f"repeats={self.repeats}")


class FrameClassifier(nn.Module):
    """One frame -> ``outputs`` logits, for frames of any size.

    Each frame is standardized first (its colour mean taken out, divided by its own standard
    deviation), so the texture of a dark night or a foggy frame, a level or two high, reaches
    the convolutions as strongly as a bright noon's (without it a small network trained on a
    thousand frames does not learn to see a blur at all); the mean and the log deviation go to
    the head beside the pooled features, so colour and contrast still count. Convolutions
    (the first at full resolution, then stride 2) with ReLU; each channel's mean and standard
    deviation over the frame (how much of a feature there is, and how unevenly: texture)."""

    def __init__(self, widths: tuple[int, ...], outputs: int = 1):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for i, w in enumerate(widths):
            layers += [nn.Conv2d(c_in, w, 3, 1 if i == 0 else 2, 1), nn.ReLU()]
            c_in = w
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(2 * c_in + 4, outputs)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) in [-1, 1] -> (N, 2 * widths[-1] + 4)."""
        mean = x.mean((2, 3), keepdim=True)  # (N, 3, 1, 1)
        dev = (x - mean).flatten(1).std(1)[:, None, None, None] + 1e-2  # (N, 1, 1, 1)
        h = self.body((x - mean) / dev).flatten(2)  # (N, C, H'*W')
        return torch.cat([h.mean(2), h.std(2), mean.flatten(1), dev.log().flatten(1)], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # (N, outputs)


def random_crops(x: torch.Tensor, size: int, gen: torch.Generator) -> torch.Tensor:
    """One ``size`` x ``size`` crop of each frame of ``x`` (N, C, H, W), at a random place."""
    n, _, h, w = x.shape
    if size >= min(h, w):
        return x
    ys = torch.randint(0, h - size + 1, (n,), generator=gen)
    xs = torch.randint(0, w - size + 1, (n,), generator=gen)
    corners = zip(ys.tolist(), xs.tolist(), strict=True)
    return torch.stack([x[i, :, y : y + size, xx : xx + size] for i, (y, xx) in enumerate(corners)])


def world_folds(groups: np.ndarray, folds: int) -> np.ndarray:
    """Each frame's fold (0 ... folds - 1) from its world id in ``groups``: the distinct ids
    dealt out in order, so a world lies in one fold only."""
    ids = np.unique(groups)
    if not 2 <= folds <= len(ids):
        raise ValueError(f"{folds} folds need 2 <= folds <= the {len(ids)} worlds")
    return (np.searchsorted(ids, groups) * folds) // len(ids)


def fit_binary(
    net: nn.Module, x: torch.Tensor, y: torch.Tensor, view: Callable[[torch.Tensor, torch.Generator], torch.Tensor],
    *, lr: float, epochs: int, batch: int, gen: torch.Generator,
) -> None:
    """Train ``net`` to tell y = 0 from y = 1 in ``x``: Adam on a cosine schedule over
    ``epochs`` of batches shuffled by ``gen``, each batch seen through ``view`` (its crops and
    flips, drawing from ``gen``), binary cross-entropy on the net's one logit a sample."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * -(-len(x) // batch))
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            loss = F.binary_cross_entropy_with_logits(net(view(x[idx], gen)).reshape(len(idx)), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()


def train_classifier(x: torch.Tensor, y: torch.Tensor, cfg: C2STConfig) -> FrameClassifier:
    """A ``FrameClassifier`` trained from a fixed seed to tell y = 0 from y = 1 in ``x``, on
    random crops, each batch flipped at random (the world seen from above has no handedness)."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    net = FrameClassifier(cfg.widths)

    def view(xb: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        xb = random_crops(xb, cfg.crop, g)
        flips = [d for d in (2, 3) if bool(torch.rand((), generator=g) < 0.5)]
        return xb.flip(flips) if flips else xb

    fit_binary(net, x, y, view, lr=cfg.lr, epochs=cfg.epochs, batch=cfg.batch, gen=gen)
    return net.eval()


def c2st_accuracy(
    a: np.ndarray, b: np.ndarray, groups_a: np.ndarray, groups_b: np.ndarray,
    cfg: C2STConfig = C2STConfig(), folds: int = 4,
) -> float:
    """The mean of ``c2st_readings``: held-out accuracy of classifiers trained to tell frames
    ``a`` from frames ``b``."""
    return float(c2st_readings(a, b, groups_a, groups_b, cfg, folds).mean())


def c2st_readings(
    a: np.ndarray, b: np.ndarray, groups_a: np.ndarray, groups_b: np.ndarray,
    cfg: C2STConfig = C2STConfig(), folds: int = 4,
) -> np.ndarray:
    """(cfg.repeats,) held-out accuracies of classifiers trained to tell frames ``a`` from
    frames ``b``, one per seed (``cfg.seed``, ``cfg.seed + 1``, ...).

    ``groups_a`` / ``groups_b`` name each frame's world. The worlds are dealt into ``folds``
    folds; each fold is judged by a classifier trained on the other folds' worlds only, so no
    place is on both sides, and every world is judged once (with a handful of worlds, one
    held-out quarter of them moves the accuracy by a tenth from one draw to the next). The
    accuracy is balanced (the mean of the two sets' own accuracies), so unequal set sizes do
    not move the 0.5 of indistinguishable sets. Their spread is the reading's own noise: one
    classifier's accuracy on the same frames moves by a tenth with its seed where the two sets
    are close (docs/model.md)."""
    if a.shape[1:] != b.shape[1:] or a.ndim != 4 or a.shape[-1] != 3:
        raise ValueError(f"frame sets must be (N, H, W, 3) of one size, got {a.shape} and {b.shape}")
    if len(groups_a) != len(a) or len(groups_b) != len(b):
        raise ValueError(f"one group per frame: {len(groups_a)} for {len(a)}, {len(groups_b)} for {len(b)}")
    fold = torch.from_numpy(world_folds(np.concatenate([groups_a, groups_b]), folds))
    x = to_input(np.concatenate([a, b]))
    y = torch.cat([torch.zeros(len(a)), torch.ones(len(b))])
    right = torch.zeros(cfg.repeats, len(x), dtype=torch.bool)
    for k in range(folds):
        test = fold == k
        if y[~test].min() == y[~test].max():
            raise ValueError("both sets need frames outside every fold of worlds")
        for r in range(cfg.repeats):
            net = train_classifier(x[~test], y[~test], replace(cfg, seed=cfg.seed + r))
            with torch.no_grad():
                xt = x[test]
                pred = torch.cat([net(xt[s : s + 256])[:, 0] for s in range(0, len(xt), 256)]) > 0
            right[r, test] = pred == (y[test] > 0.5)
    return ((right[:, y < 0.5].float().mean(1) + right[:, y > 0.5].float().mean(1)) / 2).numpy().astype(np.float64)


# -- Frechet distance ------------------------------------------------------------------------


def frechet_distance(fa: np.ndarray, fb: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to feature sets ``fa`` (N, D) and ``fb`` (M, D):
    |mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a^1/2 S_b S_a^1/2)^1/2)."""
    if fa.ndim != 2 or fb.ndim != 2 or fa.shape[1] != fb.shape[1] or len(fa) < 2 or len(fb) < 2:
        raise ValueError(f"feature sets must be (N>=2, D) of one D, got {fa.shape} and {fb.shape}")
    fa, fb = fa.astype(np.float64), fb.astype(np.float64)
    mu_a, mu_b = fa.mean(0), fb.mean(0)
    s_a, s_b = np.cov(fa, rowvar=False), np.cov(fb, rowvar=False)
    w, v = np.linalg.eigh(s_a)
    root_a = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    cross = np.linalg.eigvalsh(root_a @ s_b @ root_a)
    trace_root = float(np.sqrt(np.clip(cross, 0, None)).sum())
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(s_a) + np.trace(s_b) - 2 * trace_root)


# -- patch realism ---------------------------------------------------------------------------


def patch_descriptors(frames: np.ndarray, size: int = 8, stride: int = 8) -> torch.Tensor:
    """What every ``size`` x ``size`` patch at ``stride`` of the frames is made of: its mean
    colour (3), each channel's standard deviation (3) and the mean absolute step between
    neighbouring pixels' luminance, across and down (2), all in grey levels: (P, 8)."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()  # (N, 3, H, W)
    cols = F.unfold(x, size, stride=stride)  # (N, 3 * size * size, L)
    p = cols.transpose(1, 2).reshape(-1, 3, size, size)  # (P, 3, size, size)
    lum = p.mean(1)  # (P, size, size)
    across = (lum[:, :, 1:] - lum[:, :, :-1]).abs().mean((1, 2))
    down = (lum[:, 1:] - lum[:, :-1]).abs().mean((1, 2))
    return torch.cat([p.mean((2, 3)), p.std((2, 3)), across[:, None], down[:, None]], 1)


def patch_distance(frames: np.ndarray, bank: np.ndarray, size: int = 8, bank_stride: int = 1) -> float:
    """Mean over the frames' ``size``-pixel patches (non-overlapping) of the distance to the
    nearest patch of ``bank``'s frames (every patch at ``bank_stride``), patches compared by
    ``patch_descriptors``.

    Not pixel by pixel: the nearest patch in pixel distance rewards flat patches (the mean of a
    texture is nearer any one piece of it than another piece of the same texture is), so a copy
    of the world's frames made of flat 16-pixel blocks scored 0.2-0.7 of the world's own frames
    on five scenes; by colour, contrast and edge strength it scores 1.1-3.2 of them."""
    q = patch_descriptors(frames, size, size)
    k = patch_descriptors(bank, size, bank_stride)
    best = torch.cat([torch.cdist(q[s : s + 2048], k).min(1).values for s in range(0, len(q), 2048)])
    return float(best.mean())
