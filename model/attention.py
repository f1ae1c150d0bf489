"""Attention backends: flash-attn on CUDA when installed, torch SDPA everywhere else.

Tensors use the (B, T, H, D) layout of flash-attn; SDPA gets transposed views.
The CPU path (SDPA) is the one every test runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # optional: the `gpu` extra
    from flash_attn import flash_attn_func as _flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    _flash_attn_func = None


def flash_available(device: torch.device) -> bool:
    return _flash_attn_func is not None and device.type == "cuda"


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q (B, Tq, H, D), k/v (B, Tk, H, D), mask broadcastable to (B, H, Tq, Tk) bool or None.

    Returns (B, Tq, H, D). Without a mask (every cached slot valid, the steady state) and on
    CUDA with flash-attn installed, flash-attn runs; otherwise SDPA.
    """
    if mask is None and flash_available(q.device) and q.dtype in (torch.float16, torch.bfloat16):
        return _flash_attn_func(q, k, v)  # pragma: no cover - needs CUDA
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    )  # (B, H, Tq, D)
    return o.transpose(1, 2)
