"""The warp head's mechanics: per-token separable shift kernels applied to a frame.

``shift_warp`` moves each token's block of the previous frame by that token's kernels
(softmax weights over offsets -r..r in y and x); ``model/default/net/dit.py``'s head calls it once per
motion layer. The band matrices it multiplies by are kept per thread and role when no
gradient is needed (serving, self-rollout).
"""

from __future__ import annotations

import threading

import torch


def shift_warp(prev: torch.Tensor, ky: torch.Tensor, kx: torch.Tensor, radius: int, p: int) -> torch.Tensor:
    """Apply per-token separable shift kernels to the previous frame.

    prev (N, C, H, W); ky, kx (N, gh, gw, taps) softmax weights over offsets -r..r.
    out(y, x) = sum_ij ky[j] kx[i] prev(y + j - r, x + i - r), edges replicated.
    Each pass is one batched matmul: along x, every token row's pixel rows times a banded
    (W, W) matrix holding each column's token weights on its diagonals (the replicated edge
    folded in: taps past the border add onto the border pixel); along y, the same per token
    column. Two small matmuls instead of 2·taps passes over the frame, and no padded copies.
    """
    n, c, h, w = prev.shape
    g, taps = h // p, 2 * radius + 1
    rows = prev.reshape(n, c, g, p, w).transpose(1, 2).reshape(n * g, c * p, w)  # per token row
    bx = _band(kx.reshape(n * g, g, taps).repeat_interleave(p, 1), "x")  # (N*gh, W, W)
    out_x = torch.bmm(rows, bx).view(n, g, c, p, g, p)  # (N, gy, C, py, gx, px)
    cols = out_x.permute(0, 4, 1, 3, 5, 2).reshape(n * g, h, p * c)  # per token column
    by = _band(ky.transpose(1, 2).reshape(n * g, g, taps).repeat_interleave(p, 1), "y")  # (N*gw, H, H)
    out = torch.bmm(by.transpose(1, 2), cols)  # (N*gw, H, px*C)
    return out.view(n, g, h, p, c).permute(0, 4, 2, 1, 3).reshape(n, c, h, w)


_BAND_INDEX: dict[tuple[int, int, torch.device], torch.Tensor] = {}
_BAND_BUFFERS = threading.local()  # per thread: {(role, b, n, taps, dtype, device): buffer}


def _band(weights: torch.Tensor, role: str = "") -> torch.Tensor:
    """weights (B, n, taps) -> (B, n, n) banded: M[clamp(x + i - r), x] += weights[x, i],
    r = taps // 2, so column x of ``rows @ M`` is sum_i weights[x, i] rows[clamp(x + i - r)].

    Without autograd (serving, self-rollout) the matrix is built in a buffer kept per
    thread, ``role`` and shape, instead of a fresh zero-filled allocation per forward (with
    ``tests/model/test_chunk_steps.py`` holding it to the reference warp). The caller must
    be done with the last matrix of a role before asking for the next one."""
    b, n, taps = weights.shape
    key = (n, taps, weights.device)
    if key not in _BAND_INDEX:
        with torch.inference_mode(False):  # a normal tensor: training may scatter with it too
            x, i = torch.arange(n)[:, None], torch.arange(taps)[None, :]
            src = (x + i - taps // 2).clamp(0, n - 1)
            _BAND_INDEX[key] = (src * n + x).reshape(-1).to(weights.device)
    if torch.is_grad_enabled():
        band = weights.new_zeros(b, n * n)
    else:
        buffers = _BAND_BUFFERS.__dict__.setdefault("by_key", {})
        bkey = (role, b, n, taps, weights.dtype, weights.device)
        band = buffers.get(bkey)
        if band is None:
            with torch.inference_mode(False):  # writable outside inference mode too
                band = buffers[bkey] = weights.new_zeros(b, n * n)
        else:
            band.zero_()
    band.scatter_add_(1, _BAND_INDEX[key].expand(b, -1), weights.reshape(b, -1))
    return band.view(b, n, n)
