"""A pixel-level refiner for the head's clean-frame guess (``ModelConfig.refine_channels``).

The transformer sees a frame as one token per 16-pixel patch and draws each patch from its
own token, so what it makes up (terrain it has never seen) comes out as one flat block per
token, with seams on the token grid. The refiner is three small convolutions at full
resolution over

- the head's guess,
- the innovation: the noisy input minus the guess's share of it, ``x_t - (1 - t) guess``,
  which is ``(1 - t) (x0 - guess) + t eps``, what the noisy frame says beyond the guess,
- the noise level ``t`` as a constant plane,

and adds its output to the guess. It reaches across token borders (a 9-pixel field) and can
keep detail the noisy frame carries at low noise levels, which the 16x16 patch stem folds
into one token. Its last convolution starts at zero, so weights trained without it behave
exactly as before when it is added.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PixelRefiner(nn.Module):
    def __init__(self, channels: int, hidden: int):
        super().__init__()
        self.inp = nn.Conv2d(2 * channels + 1, hidden, 3, padding=1)
        self.mid = nn.Conv2d(hidden, hidden, 3, padding=2, dilation=2)
        self.out = nn.Conv2d(hidden, channels, 3, padding=1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, guess: torch.Tensor, noisy: torch.Tensor, level: torch.Tensor | float) -> torch.Tensor:
        """guess, noisy (N, C, H, W); level the noise level, of every frame (a float) or of
        each (N,) -> refined guess (N, C, H, W), in the refiner's dtype."""
        dt = self.out.weight.dtype
        n, _, h, w = guess.shape
        guess, noisy = guess.to(dt), noisy.to(dt)
        if isinstance(level, torch.Tensor):
            t = level.to(dt).view(n, 1, 1, 1)
        else:
            t = guess.new_full((n, 1, 1, 1), level)
        z = torch.cat((guess, noisy - (1 - t) * guess, t.expand(n, 1, h, w)), 1)
        z = z.contiguous(memory_format=torch.channels_last)  # the fast layout for CPU convolutions
        z = F.gelu(self.mid(F.gelu(self.inp(z))))
        return guess + self.out(z).contiguous()
