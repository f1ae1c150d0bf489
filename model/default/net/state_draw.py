"""How the network lays the live state (what moves) on a frame: learned, pixel by pixel.

The state arrives as channels after the reference (``model/default/reference/live/channels.py``
writes them; their layout is ``STATE_LAYOUT`` below): per kind of actor a footprint ``f`` and
its moments along and across the actor's heading, per kind a footprint signed by variant, then
cloud cover and fog. The channels say where things are and how they lie, never their pixels.

Two learned parts turn them into colour:

- **a per-pixel basis** (``StateBasis``): per kind, a small MLP of the pixel's place in the
  actor's frame (``u, v`` recovered from the moments, the variant's sign, the footprint) gives
  ``features`` values at every pixel an actor covers. It learns the actor's shape (a body and a
  head, a hull, a deck, a sail, a wake) where the five moment channels can only make a
  quadratic bump.
- **per-token colours** (the model's state heads): per token, a gain and a colour for each
  channel, raw and basis, so the token says what a herd or a boat looks like under its scene's
  light. The coefficients are interpolated bilinearly between token centres (held over 4 x 4
  pixel blocks), so a cloud's edge shades smoothly across the 16-pixel token seams.

``frame' = (frame + 1) * (1 + gain) - 1 + colour`` with ``gain = sum_k coef_g,k * s_k`` and
``colour = sum_k coef_c,k * s_k`` over the channels ``s_k`` at the pixel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BLOCK = 4  # pixels per side over which the interpolated coefficients are held
AXES = 5  # per kind: f, f*u, f*v, f*u^2, f*v^2 (``reference/live/channels.py``)
STATE_LAYOUT = "per kind: f, f*u, f*v, f*u^2, f*v^2; per kind: f*variant_sign; cloud; fog"


def state_kinds(state_channels: int) -> int:
    """Kinds of actor in a state of ``state_channels`` laid out as ``STATE_LAYOUT``."""
    kinds, rest = divmod(state_channels - 2, AXES + 1)
    if rest or kinds < 1:
        raise ValueError(f"{state_channels} state channels do not follow the layout {STATE_LAYOUT!r}")
    return kinds


class StateBasis(nn.Module):
    """Per kind, ``features`` learned values of the pixel's place in an actor's frame, zero
    where no actor of the kind reaches. Input (N, K, H, W) state channels; output
    (N, kinds * features, H, W)."""

    def __init__(self, state_channels: int, features: int, hidden: int = 24):
        super().__init__()
        self.kinds, self.features = state_kinds(state_channels), features
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(4, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                          nn.Linear(hidden, features))
            for _ in range(self.kinds)
        )

    def forward(self, st: torch.Tensor) -> torch.Tensor:
        out = []
        for k, mlp in enumerate(self.mlps):
            f = st[:, k * AXES]
            safe = f.clamp_min(1e-3)
            place = torch.stack(
                (f.clamp(max=1.0), st[:, k * AXES + 1] / safe, st[:, k * AXES + 2] / safe,
                 st[:, self.kinds * AXES + k] / safe),
                -1,
            ).clamp(-2.0, 2.0)  # (N, H, W, 4); overlapping actors give their weighted mean place
            w = mlp[0].weight
            flat, inside = place.reshape(-1, 4).to(w.dtype), (f > 0).reshape(-1)
            vals = flat.new_zeros(flat.shape[0], self.features).index_put((inside,), mlp(flat[inside]))
            out.append(vals.view(*f.shape, self.features).permute(0, 3, 1, 2))  # only covered pixels computed
        return torch.cat(out, 1)


def lay_state(frame: torch.Tensor, coef: torch.Tensor, st: torch.Tensor, patch: int) -> torch.Tensor:
    """``frame`` (B, F, C, H, W) with the state laid on it. ``coef`` (B*F, g, g, 2, C, K) per
    token, a gain and a colour per channel; ``st`` (B*F, K, H, W) the channels (raw then
    basis). The coefficients are interpolated bilinearly between token centres to the centre
    of each ``BLOCK`` x ``BLOCK`` block of pixels and held over the block: one batched product
    of each block's coefficients with its pixels' channels."""
    b, f, ch, h, w = frame.shape
    n, g, k = coef.shape[0], coef.shape[1], coef.shape[-1]
    qh, qw = h // BLOCK, w // BLOCK
    per_token = coef.reshape(n, g, g, 2 * ch * k).permute(0, 3, 1, 2)
    per_block = F.interpolate(per_token, size=(qh, qw), mode="bilinear", align_corners=False)
    cb = per_block.view(n, 2 * ch, k, qh, qw).permute(0, 3, 4, 1, 2).reshape(n * qh * qw, 2 * ch, k)
    sb = st.to(cb.dtype).view(n, k, qh, BLOCK, qw, BLOCK).permute(0, 2, 4, 1, 3, 5).reshape(n * qh * qw, k, -1)
    laid = torch.bmm(cb, sb).view(n, qh, qw, 2 * ch, BLOCK, BLOCK).permute(0, 3, 1, 4, 2, 5)
    laid = laid.reshape(b, f, 2, ch, h, w)
    return ((frame.float() + 1) * (1 + laid[:, :, 0]) - 1 + laid[:, :, 1]).to(frame.dtype)
