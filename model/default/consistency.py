"""The cache-consistency check: chunk-by-chunk cached generation against one full-sequence pass.

Used by the tests (fp32, must agree to 1e-4) and reported by ``bench.model_step`` as kv_maxerr.
"""

from __future__ import annotations

import numpy as np
import torch

from worldserve.model.default.kv_cache import KVCachePool
from worldserve.model.default.net.dit import WorldModel


def _sequence(model: WorldModel, n: int, bucket: int, seed: int) -> tuple[torch.Tensor, ...]:
    """A random sequence drawn on the host (the same on every device), moved to the model's."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1, n, cfg.channels, bucket, bucket, generator=g) * 2 - 1
    actions = torch.randn(1, n, cfg.action_dim, generator=g)
    scene = torch.randn(1, cfg.scene_dim, generator=g)
    fc = cfg.frames_per_chunk
    prev = torch.zeros_like(x)
    for i in range(n):
        start = (i // fc) * fc
        if start > 0:  # every frame of a chunk sees the frame before the chunk
            prev[:, i] = x[:, start - 1]
    if cfg.prev_channels > cfg.channels:  # an anchor reference, valid on the right half
        ref = torch.rand(1, n, cfg.channels, bucket, bucket, generator=g) * 2 - 1
        mask = torch.zeros(1, n, 1, bucket, bucket)
        mask[..., bucket // 2 :] = 1.0
        prev = torch.cat((prev, ref * mask, mask), 2)
    w = next(model.parameters())
    return tuple(t.to(w.device, w.dtype) for t in (x, prev, actions, scene))


@torch.inference_mode()
def cached_vs_full(model: WorldModel, n_chunks: int, bucket: int, seed: int = 1) -> float:
    """Largest |difference| between the cached path and ``forward_sequence``: every chunk of a
    clean sequence at noise 0 (past the point where the window wraps, with sink frames), and
    a noisy last chunk as a generation query against the same cache."""
    cfg = model.cfg
    fc = cfg.frames_per_chunk
    n = n_chunks * fc
    x, prev, actions, scene = _sequence(model, n, bucket, seed)
    dtype, dev = x.dtype, x.device
    pos = torch.arange(n)
    full, _ = model.forward_sequence(
        x, prev, torch.zeros(1, n, device=dev), actions, scene, pos, torch.zeros(n, dtype=torch.bool)
    )
    pool = KVCachePool.create(cfg, bucket, 1, model.rope, dtype=dtype, device=dev)
    slot = pool.allocate()
    err = 0.0
    for c in range(n_chunks):
        sl = slice(c * fc, (c + 1) * fc)
        ctx = pool.context([slot], np.array([c * fc]))
        out = model.denoise_chunk(x[:, sl], prev[:, sl], 0.0, actions[:, sl], scene, ctx)
        err = max(err, (out - full[:, sl]).abs().max().item())
        if c < n_chunks - 1:
            k, v = model.commit_chunk(x[:, sl], prev[:, sl], actions[:, sl], scene, ctx)
            pool.commit([slot], np.arange(c * fc, (c + 1) * fc)[None], k, v)

    last = slice((n_chunks - 1) * fc, n)
    g = torch.Generator().manual_seed(seed + 1)
    noisy = (torch.rand(x[:, last].shape, generator=g) * 2 - 1).to(dev, dtype)
    ctx = pool.context([slot], np.array([(n_chunks - 1) * fc]))
    out = model.denoise_chunk(noisy, prev[:, last], 0.5, actions[:, last], scene, ctx)
    noise = torch.zeros(1, n, device=dev)
    noise[:, last] = 0.5
    flags = torch.zeros(n, dtype=torch.bool)
    flags[last] = True
    ref, _ = model.forward_sequence(torch.cat((x[:, : last.start], noisy), 1), prev, noise, actions, scene, pos, flags)
    return max(err, (out - ref[:, last]).abs().max().item())
