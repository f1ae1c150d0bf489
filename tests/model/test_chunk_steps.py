"""The hot path's pieces agree with their plain definitions: the prepared chunk (shared
stem half, conditioning for every level at once, context buffer with an own-key tail)
gives what one-call steps give, and the tap-loop warp is the separable kernel it names."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from worldserve.model.default.kv_cache import KVCachePool
from worldserve.model.default.net.dit import WorldModel, shift_warp

from .conftest import randomized, tiny_config


def reference_warp(prev: torch.Tensor, ky: torch.Tensor, kx: torch.Tensor, r: int, p: int) -> torch.Tensor:
    """out(y, x) = sum_ij ky[j] kx[i] prev(y + j - r, x + i - r), edges replicated, by unfold."""
    wx = kx.repeat_interleave(p, 1).repeat_interleave(p, 2)
    wy = ky.repeat_interleave(p, 1).repeat_interleave(p, 2)
    out = torch.einsum("nchwk,nhwk->nchw", F.pad(prev, (r, r, 0, 0), mode="replicate").unfold(3, 2 * r + 1, 1), wx)
    return torch.einsum("nchwk,nhwk->nchw", F.pad(out, (0, 0, r, r), mode="replicate").unfold(2, 2 * r + 1, 1), wy)


def test_shift_warp_matches_the_separable_kernel() -> None:
    g = torch.Generator().manual_seed(0)
    for h, r, p in ((64, 5, 16), (32, 2, 8), (128, 10, 16)):
        prev = torch.randn(3, 3, h, h, generator=g)
        n = h // p
        ky = torch.randn(3, n, n, 2 * r + 1, generator=g).softmax(-1)
        kx = torch.randn(3, n, n, 2 * r + 1, generator=g).softmax(-1)
        assert torch.allclose(shift_warp(prev, ky, kx, r, p), reference_warp(prev, ky, kx, r, p), atol=1e-5)


def test_shift_warp_trains_after_serving() -> None:
    g = torch.Generator().manual_seed(1)
    prev = torch.randn(2, 3, 32, 32, generator=g)
    logits = torch.randn(2, 2, 4, 4, 5, generator=g)
    with torch.inference_mode():  # the runner warms its caches in inference mode first
        shift_warp(prev, logits[0].softmax(-1), logits[1].softmax(-1), 2, 8)
    grads = []
    for warp in (shift_warp, reference_warp):
        w = logits.clone().requires_grad_(True)
        warp(prev, w[0].softmax(-1), w[1].softmax(-1), 2, 8).square().mean().backward()
        assert w.grad is not None
        grads.append(w.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_shift_warp_reuses_its_band_buffers_without_leaking_old_kernels() -> None:
    """Without autograd the band matrices live in reused buffers: each call's kernels must
    replace the last call's, in inference mode and in plain no-grad mode alike."""
    g = torch.Generator().manual_seed(2)
    prev = torch.randn(2, 3, 32, 32, generator=g)
    r, p, n = 3, 8, 4
    for ctx in (torch.inference_mode, torch.no_grad, torch.inference_mode):
        with ctx():
            for _ in range(3):
                ky = torch.randn(2, n, n, 2 * r + 1, generator=g).mul(4).softmax(-1)
                kx = torch.randn(2, n, n, 2 * r + 1, generator=g).mul(4).softmax(-1)
                assert torch.allclose(shift_warp(prev, ky, kx, r, p), reference_warp(prev, ky, kx, r, p), atol=1e-5)


def test_a_one_hot_kernel_shifts_the_frame() -> None:
    prev = torch.arange(64 * 64, dtype=torch.float32).view(1, 1, 64, 64)
    r = 3
    kx = torch.zeros(1, 4, 4, 2 * r + 1)
    ky = torch.zeros(1, 4, 4, 2 * r + 1)
    kx[..., r + 2] = 1.0  # read 2 px to the right
    ky[..., r] = 1.0
    out = shift_warp(prev, ky, kx, r, 16)
    assert torch.equal(out[..., :, :-2], prev[..., :, 2:])
    assert torch.equal(out[..., :, -2:], prev[..., :, -1:].expand(-1, -1, -1, 2))  # edge replicated


@torch.no_grad()
def test_prepared_steps_equal_one_call_steps() -> None:
    cfg = tiny_config()
    model = randomized(cfg)
    b, bucket = 3, 32
    pool = KVCachePool.create(cfg, bucket, b, model.rope)
    slots = [pool.allocate() for _ in range(b)]
    g = torch.Generator().manual_seed(1)
    shape = (b, 1, cfg.channels, bucket, bucket)
    scene = torch.randn(b, cfg.scene_dim, generator=g)
    reference = (b, 1, cfg.prev_channels - cfg.channels, bucket, bucket)  # the anchor's: a random one
    prev = torch.cat((torch.zeros(shape), torch.rand(reference, generator=g)), 2)
    for frame in range(6):  # fill sinks and wrap the window
        ctx = pool.context(slots, np.full(b, frame))
        act = torch.randn(b, 1, cfg.action_dim, generator=g)
        levels = [0.9, 0.5, 0.2]
        inp = model.prepare_chunk(prev, act, scene, [*levels, 0.0])
        x = torch.randn(shape, generator=g)
        for i, t in enumerate(levels):
            one = model.denoise_chunk(x, prev, t, act, scene, ctx)
            assert torch.allclose(model.denoise_step(x, inp, i, ctx), one, atol=1e-5)
        clean = WorldModel.encode(WorldModel.decode(one))
        k1, v1 = model.commit_chunk(clean, prev, act, scene, ctx)
        k2, v2 = model.commit_step(clean, inp, ctx)
        assert torch.allclose(k1, k2, atol=1e-5) and torch.allclose(v1, v2, atol=1e-5)
        pool.commit(slots, np.full((b, 1), frame), k2, v2)
        prev = torch.cat((clean, torch.rand(reference, generator=g)), 2)
