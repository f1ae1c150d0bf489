"""The texture term of training (``training/train.py``, ``--texture-weight``): the x0 guesses'
feature statistics against the renderer's frames.

A squared-error regressor draws what it cannot know as the mean of what it might be, and a
critic (``training/critic.py``) can be fooled by grain. This term asks for neither a pixel nor
a verdict: it compares *statistics* of a frame, the way texture synthesis describes a
texture, so where a guess is placed does not matter but what it is made of does. Each frame
goes through a fixed, random convolution pyramid (four 3x3 layers, halving the resolution
between them, so the last sees ~30 pixels: a tree, a roof, a stretch of shore) and at every
level the channel means and the centred Gram matrix (channel co-occurrence, averaged over the
frame) are kept, with the pixels' own colour mean and covariance as level 0. The mean of
many terrains has other statistics than any one terrain (its Gram is lower: the co-occurring
edges cancel), and so does a frame of 16-pixel blocks; the renderer's frame of the same
moment, same scene, is the reference. Random filters are enough to describe a texture
(Ustyuzhaninov et al., 2017), and they cannot be gamed the way a trained critic is, since
they do not move. Like the critic's, the term reaches only the pixels the caller names (the
model's training: what the anchor does not show), while the statistics are the whole frame's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worldserve.training.targets import sampled_guesses

WIDTHS = (24, 48, 48, 48)


class TexturePyramid(nn.Module):
    """Fixed random features: (M, C, H, W) in [-1, 1] -> per level (means (M, K), Gram (M, K, K))."""

    def __init__(self, channels: int = 3, widths: tuple[int, ...] = WIDTHS, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.convs = nn.ModuleList()
        c_in = channels
        for w in widths:
            conv = nn.Conv2d(c_in, w, 3, 1, 1, padding_mode="reflect")
            with torch.no_grad():  # He init, zero-mean filters: edges and spots, not brightness
                wt = torch.randn(conv.weight.shape, generator=g) * (2.0 / (9 * c_in)) ** 0.5
                conv.weight.copy_(wt - wt.mean(dim=(2, 3), keepdim=True))
                conv.bias.copy_(torch.randn(w, generator=g) * 0.1)
            self.convs.append(conv)
            c_in = w
        self.requires_grad_(False)

    @staticmethod
    def _stats(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = h.flatten(2)  # (M, K, P)
        mean = flat.mean(2)
        cen = flat - mean[:, :, None]
        return mean, cen @ cen.transpose(1, 2) / flat.shape[2]

    def forward(self, frames: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = [self._stats(frames)]
        h = frames
        for i, conv in enumerate(self.convs):
            if i:
                h = F.avg_pool2d(h, 2)
            h = F.relu(conv(h))
            out.append(self._stats(h))
        return out


def _relative(
    diff: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dims: tuple[int, ...], eps: float
) -> torch.Tensor:
    """|a - b|^2 / (|a|^2 + |b|^2): 0 alike, 1 where one is flat, at most 2; bounded, so a
    saturated guess beside a calm reference (the Gram of stripes over that of still water)
    weighs no more than a flat guess beside a busy one."""
    return (diff**2).sum(dims) / ((a**2).sum(dims) + (b**2).sum(dims) + eps)


class TextureLoss:
    """``loss(pred, real, reach)``: how far the guesses' statistics are from the renderer's.

    Every level's mean and Gram distance is relative (``_relative``), so every level counts
    alike whatever its scale; the sum over levels is averaged over frames. ``frames`` caps
    how many frames of a batch are compared (a random subset, drawn from ``g``), which
    bounds the cost."""

    def __init__(self, channels: int = 3, frames: int = 48, device: torch.device | str = "cpu"):
        self.pyramid = TexturePyramid(channels).to(device)
        self.frames = frames

    def statistics(self, frames: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(M, C, H, W) -> every level's (means, Gram), to compare with ``compare``."""
        return self.pyramid(frames)

    @staticmethod
    def compare(sa: list[tuple[torch.Tensor, torch.Tensor]],
                sb: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Two frames' statistics -> (M,) the summed relative distance of the first's from the second's."""
        total = sa[0][0].new_zeros(sa[0][0].shape[0])
        for (ma, ga), (mb, gb) in zip(sa, sb, strict=True):
            total = total + _relative(ma - mb, ma, mb, (1,), 1e-2)
            total = total + _relative(ga - gb, ga, gb, (1, 2), 1e-8)
        return total

    def distance(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(M, C, H, W) twice -> (M,) the summed relative distance of a's statistics from b's."""
        return self.compare(self.statistics(a), self.statistics(b))

    def loss(self, pred: torch.Tensor, real: torch.Tensor, g: torch.Generator,
             reach: torch.Tensor | None = None) -> torch.Tensor:
        """pred, real (B, N, C, H, W); ``reach`` (B, N, 1, H, W) in [0, 1]: where the term may
        move the guess (the statistics are still the whole frame's)."""
        fake, real, _ = sampled_guesses(pred, real, g, self.frames, reach)
        return self.distance(fake, real).mean()
