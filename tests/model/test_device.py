"""Every tensor of the model's paths lives on the model's device.

CUDA is not here, so the checks run on PyTorch's meta device: it computes shapes only, and
like CUDA it refuses any op that mixes its tensors with host tensors. A table or index left
on the host (rope tables, masks, cache indices, noise) fails these tests as it would on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import worldserve.training.train as train_mod
from worldserve.model.default.kv_cache import KVCachePool
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.training.data import WorldPool

TINY = ModelConfig(width=48, depth=2, heads=2, time_rope_dims=8, window_frames=2, sink_frames=1)
META = torch.device("meta")


def test_mixing_host_and_meta_tensors_is_refused() -> None:
    """The premise of this file: a host tensor in a meta op fails, as on CUDA."""
    with pytest.raises(RuntimeError, match="device"):
        torch.zeros(2, device=META) + torch.ones(2)


def test_chunk_steps_run_on_the_device_past_the_wrapped_window() -> None:
    cfg = TINY
    model = WorldModel(cfg).to(META)
    b = 2
    pool = KVCachePool.create(cfg, 64, b, model.rope, device=META)
    slots = [pool.allocate() for _ in range(b)]
    a = torch.zeros(b, 1, cfg.action_dim, device=META)
    scene = torch.zeros(b, cfg.scene_dim, device=META)
    x = torch.randn(b, 1, cfg.channels, 64, 64, device=META)
    prev = torch.randn(b, 1, cfg.prev_channels, 64, 64, device=META)  # the frame and its anchor reference
    for i in range(cfg.cache_frames + 3):  # empty slots (masked), sink, full ring, wrapped
        ctx = pool.context(slots, np.full(b, i))
        assert ctx.k.device == META and ctx.rope_q.cos.device == META
        inp = model.prepare_chunk(prev, a, scene, (0.75, 0.0))
        y = model.denoise_step(x, inp, 0, ctx)
        k, v = model.commit_step(y, inp, ctx)
        pool.commit(slots, np.full((b, 1), i), k, v)
    assert y.device == META and y.shape == x.shape


def test_a_training_step_with_self_rollout_runs_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # meta tensors take no generator: the noise is drawn unseeded there (shapes are all that count)
    monkeypatch.setattr(train_mod, "randn", lambda shape, g: torch.randn(shape, device=META))
    monkeypatch.setattr(train_mod, "noise_levels", lambda shape, cfg, g: torch.rand(shape, device=META))
    model = WorldModel(TINY).to(META)
    batch = WorldPool(1, TINY.buckets, np.random.default_rng(0), map_size=256).sequences(2, 5, 64, far=True)
    loss, stats = train_mod.train_step(model, batch, TINY, torch.Generator(), use_rollout=True, edge_weight=0.2)
    loss.backward()
    assert loss.device == META and all(v.device == META for v in stats.values())
    assert all(p.grad is not None and p.grad.device == META for p in model.blocks.parameters())
