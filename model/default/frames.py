"""Frames between sizes: a client's observation or a session's cached frames at another bucket."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def resize_frames(frames: np.ndarray, size: int) -> np.ndarray:
    """(N, H, W, 3) uint8 -> (N, size, size, 3) uint8 (area when shrinking, bilinear else)."""
    # a copy: a client's frame is read-only
    x = torch.from_numpy(np.array(frames, order="C", copy=True)).permute(0, 3, 1, 2).float()
    mode = "area" if size < frames.shape[1] else "bilinear"
    y = F.interpolate(x, size=(size, size), mode=mode, **({} if mode == "area" else {"align_corners": False}))
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
