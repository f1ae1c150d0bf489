"""Measures of single frames (uint8, H x W x 3) that ``bench.quality`` compares between the
model's long rollout and the renderer's: contrast, sharpness, and the three that tell
whether late content looks like the world (``docs/long_rollout.md``): anisotropy (stripes),
seams (one flat block per token) and the colour histogram's overlap; and, between batches
of frames, the texture distance of training's texture term."""

from __future__ import annotations

import numpy as np
import torch

from worldserve.training.texture import TextureLoss


def contrast(frame: np.ndarray) -> float:
    return float(frame.astype(np.float32).mean(-1).std())


def sharpness(frame: np.ndarray) -> float:
    g = frame.astype(np.float32).mean(-1)
    return float(np.abs(np.diff(g, axis=0)).mean() + np.abs(np.diff(g, axis=1)).mean())


def anisotropy(frame: np.ndarray) -> float:
    """|Gy - Gx| / (Gy + Gx) of the mean absolute gradients along each axis: near 0 for
    the world's ground, toward 1 for streaks and stripes."""
    g = frame.astype(np.float32).mean(-1)
    gy, gx = float(np.abs(np.diff(g, axis=0)).mean()), float(np.abs(np.diff(g, axis=1)).mean())
    return abs(gy - gx) / max(gy + gx, 1e-6)


def seams(frame: np.ndarray, patch: int) -> float:
    """Mean absolute gradient across the lines of a ``patch``-pixel grid over the mean
    elsewhere: ~1 for content that ignores the grid, above 1 for blocks drawn per token."""
    g = frame.astype(np.float32).mean(-1)
    on, off = [], []
    for axis in (0, 1):
        d = np.abs(np.diff(g, axis=axis))  # d[i] is the step between pixels i and i + 1
        line = (np.arange(d.shape[axis]) % patch) == patch - 1
        sel = line[:, None] if axis == 0 else line[None, :]
        on.append(d[np.broadcast_to(sel, d.shape)])
        off.append(d[np.broadcast_to(~sel, d.shape)])
    return float(np.concatenate(on).mean() / max(float(np.concatenate(off).mean()), 1e-6))


COLOUR_BINS = 8  # per channel: a joint RGB histogram of 512 bins


def colour_hist(frame: np.ndarray) -> np.ndarray:
    """The frame's joint RGB histogram (COLOUR_BINS per channel), as counts."""
    q = frame.reshape(-1, 3).astype(np.int64) * COLOUR_BINS // 256
    return np.bincount((q[:, 0] * COLOUR_BINS + q[:, 1]) * COLOUR_BINS + q[:, 2], minlength=COLOUR_BINS**3)


def hist_intersection(a: np.ndarray, b: np.ndarray) -> float:
    """Overlap of two histograms, each normalized: 1 when they are the same."""
    return float(np.minimum(a / max(a.sum(), 1), b / max(b.sum(), 1)).sum())


_TEXTURE: TextureLoss | None = None
TextureStats = list[tuple[torch.Tensor, torch.Tensor]]


def texture_stats(frames: np.ndarray) -> TextureStats:
    """The texture term's statistics (``training/texture.py``) of (N, H, W, 3) uint8 frames,
    computed once for as many ``texture_distance`` calls as they take part in."""
    global _TEXTURE
    if _TEXTURE is None:
        _TEXTURE = TextureLoss()
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.no_grad():
        return _TEXTURE.statistics(x)


def texture_distance(a: TextureStats, b: TextureStats) -> float:
    """Mean over frames of the texture term's distance of ``a``'s statistics from ``b``'s
    (``texture_stats`` of as many frames each): 0 for the same frames, about 0.1 for the same
    ground moved a few pixels, more the less alike what they are made of."""
    return float(TextureLoss.compare(a, b).mean())


def mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of one frame pair (dB)."""
    return psnr_of_mse(mse(a, b))


def psnr_of_mse(err: float) -> float:
    return float(10 * np.log10(255.0**2 / max(err, 1e-10)))


def pooled_psnr(pred: np.ndarray, truth: np.ndarray) -> float:
    """PSNR of the mean squared error over all episodes (pred, truth: (E, H, W, 3)).

    Averaging per-episode PSNR in dB instead lets one identical pair (an episode that stood
    still, +148 dB for the repeat baseline) outweigh every other episode."""
    return psnr_of_mse(float(np.mean([mse(p, t) for p, t in zip(pred, truth, strict=True)])))
