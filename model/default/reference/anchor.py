"""The anchor reference: a sharp frame moved by the camera's accumulated shift, in one resample.

The warp head moves the previous frame by a per-token kernel every frame. A fractional
(mouse) shift makes that an interpolation, and interpolations compound: after a few frames
of slow motion the carried ground is blurred, while the renderer samples its sharp texture
anew each frame. So the model also sees the anchor (an
observed frame, or a frame of its own it re-anchored on) moved by the camera shift summed
since then, resampled once, and a per-pixel mix in the head may copy from it
(``WorldModel._head``). Where the anchor never showed the place, or after a prompt change
made its colours stale, the reference is marked invalid and the warp alone decides.

The shift per action is the model's own estimate (``WorldModel.camera_shift``, a linear map
trained against the commanded shift); training builds references from the commanded shift.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldserve.model.default.net.config import ModelConfig

REANCHOR_SHARE = 0.25  # re-anchor on the newest frame when less of the anchor than this stays in view
# ... and once the anchor is this many frames old: training shows the model anchors at most
# 15 frames back (16-frame sequences); an older one drifts apart from the view it has made
# since, and the per-pixel mix flickers between the two
REANCHOR_FRAMES = 64


def clamped_actions(cfg: ModelConfig, actions: torch.Tensor) -> torch.Tensor:
    """Actions (..., A) inside the ranges training saw, as the camera shift is estimated for
    them: keys in [0, 1], mouse in [-1, 1]."""
    nk = cfg.num_keys
    return torch.cat((actions[..., :nk].clamp(0, 1), actions[..., nk:].clamp(-1, 1)), -1)


def anchor_reference(anchor: torch.Tensor, offset: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """The anchor moved by ``offset`` pixels, bilinear, and where it shows anything.

    anchor (B, C, H, W) frames in [-1, 1]; offset (B, 2) the static scene's shift (dy, dx)
    since the anchor, in pixels; ``valid`` (B,) bool, False for "no usable anchor". Returns
    (B, C + 1, H, W): out(y, x) = anchor(y - dy, x - dx), zero outside the anchor, then a
    mask channel, 1 where the source lies inside it."""
    b, _, h, w = anchor.shape
    dev, dt = anchor.device, anchor.dtype
    ys = torch.arange(h, device=dev, dtype=torch.float32)[None, :, None] - offset[:, 0, None, None].float()
    xs = torch.arange(w, device=dev, dtype=torch.float32)[None, None, :] - offset[:, 1, None, None].float()
    inside = ((ys >= 0) & (ys <= h - 1)) & ((xs >= 0) & (xs <= w - 1))  # (B, H, W)
    if valid is not None:
        inside = inside & valid[:, None, None]
    grid = torch.stack((xs.expand(b, h, w) * (2 / max(w - 1, 1)) - 1, ys.expand(b, h, w) * (2 / max(h - 1, 1)) - 1), -1)
    moved = F.grid_sample(anchor.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    mask = inside[:, None].float()
    return torch.cat((moved * mask, mask), 1).to(dt)


def visible_share(offset: torch.Tensor, size: int) -> torch.Tensor:
    """Share of a ``size``² frame the anchor still covers after moving by ``offset`` (B, 2)."""
    cover = (1 - offset.abs() / max(size - 1, 1)).clamp(0, 1)
    return cover[:, 0] * cover[:, 1]


def sequence_references(frames: torch.Tensor, anchor: int, offsets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Every frame's anchor reference in a training sequence: frames (B, N, C, H, W), the
    anchor's index, offsets (B, N, 2) and valid (B, N) (``train_targets.anchor_offsets``)
    -> (B, N, C + 1, H, W)."""
    b, n, c, h, w = frames.shape
    src = frames[:, anchor, None].expand(b, n, c, h, w).reshape(b * n, c, h, w)
    ref = anchor_reference(src, offsets.reshape(b * n, 2), valid.reshape(b * n))
    return ref.view(b, n, c + 1, h, w)
