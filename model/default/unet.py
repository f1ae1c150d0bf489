"""The convolutional path to pixels: a small U-Net that refines the head's last guess.

The head writes every 16x16-pixel token from one vector through one linear map, so what it
makes up comes out as one block per token. This path draws below and across the token grid.
It sees, at full resolution, the head's clean-frame guess, the noisy frame (at the sampler's
last level it holds the detail already drawn, which the patch stem folds into one token) and
the ``prev`` input (the previous frame, and with ``anchor_warp`` the anchor reference and its
mask); the transformer's final tokens enter at a quarter of the resolution, each token a 4x4
cell of features there. Skip connections carry the full- and half-resolution features to
the decoder:

    full res   enc0 (in -> w) ------------------------------- + --> dec0 (w) -> out (C)
    1/2 res      enc1 (w -> 2w) -------------------- + --> dec1 (2w) -^
    1/4 res        enc2 (2w -> 4w) + tokens -> mid (4w) -^

It runs once a frame, on the sampler's last denoising forward (``WorldModel.final_step``);
the earlier forwards and the commit pass are the transformer's alone, so its cost is one
pass a frame and nothing here reaches the keys and values of the KV cache. Its output is a
residual on the guess, and the last convolution starts at zero: a model that gains the path
starts as exactly the model it was, and is warm-started from that model's weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PixelUNet(nn.Module):
    """guess, noisy (M, C, H, W), prev (M, P, H, W), tokens (M, T, D) -> residual (M, C, H, W)."""

    def __init__(self, channels: int, prev_channels: int, model_width: int, patch: int, width: int):
        super().__init__()
        if patch % 4:
            raise ValueError(f"patch {patch} must be a multiple of 4 (tokens enter at a quarter of the resolution)")
        if width < 1:
            raise ValueError(f"width must be positive, got {width}")
        w = width
        self.cell = patch // 4  # a token's side at a quarter of the resolution
        self.enc0 = nn.Conv2d(2 * channels + prev_channels, w, 3, 1, 1)
        self.enc1 = nn.Conv2d(w, 2 * w, 3, 2, 1)
        self.enc2 = nn.Conv2d(2 * w, 4 * w, 3, 2, 1)
        self.tokens = nn.Linear(model_width, 4 * w * self.cell * self.cell)
        self.mid = nn.Conv2d(4 * w, 4 * w, 3, 1, 1)
        self.up1 = nn.Conv2d(4 * w, 2 * w, 1)
        self.dec1 = nn.Conv2d(2 * w, 2 * w, 3, 1, 1)
        self.up0 = nn.Conv2d(2 * w, w, 1)
        self.dec0 = nn.Conv2d(w, w, 3, 1, 1)
        self.out = nn.Conv2d(w, channels, 3, 1, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_uniform_(m.weight, a=5**0.5)  # torch's default, biases at zero
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.out.weight)  # starts as no change: the model is what it was
        nn.init.zeros_(self.out.bias)

    def token_map(self, tokens: torch.Tensor, grid: int) -> torch.Tensor:
        """(M, grid², D) -> (M, 4w, grid·cell, grid·cell): each token a cell of features."""
        m, k, c = tokens.shape[0], self.cell, self.mid.in_channels
        x = self.tokens(tokens).view(m, grid, grid, c, k, k).permute(0, 3, 1, 4, 2, 5)  # (M, 4w, g, k, g, k)
        return x.reshape(m, c, grid * k, grid * k)

    def forward(self, guess: torch.Tensor, noisy: torch.Tensor, prev: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        grid = guess.shape[-1] // (4 * self.cell)  # tokens per side
        s0 = F.silu(self.enc0(torch.cat((guess, noisy, prev), 1)))  # (M, w, H, W)
        s1 = F.silu(self.enc1(s0))  # (M, 2w, H/2, W/2)
        h = F.silu(self.enc2(s1) + self.token_map(tokens, grid))  # (M, 4w, H/4, W/4)
        h = F.silu(self.mid(h))
        h = F.silu(self.dec1(F.interpolate(self.up1(h), scale_factor=2.0, mode="nearest") + s1))  # (M, 2w, H/2, W/2)
        h = F.silu(self.dec0(F.interpolate(self.up0(h), scale_factor=2.0, mode="nearest") + s0))  # (M, w, H, W)
        return self.out(h)
