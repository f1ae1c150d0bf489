"""The convolutional path to pixels (``model/default/unet.py``): its shapes, that a model
gaining it starts as the model it was, and that cached serving still equals the full pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.model.conftest import randomized, tiny_config
from worldserve.model.default.config import ModelConfig
from worldserve.model.default.consistency import _sequence, cached_vs_full
from worldserve.model.default.dit import WorldModel
from worldserve.model.default.unet import PixelUNet
from worldserve.model.default.weights import load_state
from worldserve.model.kv_cache import KVCachePool


@pytest.mark.parametrize("bucket", [32, 64])
def test_the_unet_returns_a_residual_of_the_frame_shape_at_every_bucket(bucket: int) -> None:
    net = PixelUNet(channels=3, prev_channels=7, model_width=32, patch=16, width=4)
    with torch.no_grad():
        net.out.weight.normal_()
    g = bucket // 16
    out = net(torch.randn(2, 3, bucket, bucket), torch.randn(2, 3, bucket, bucket),
              torch.randn(2, 7, bucket, bucket), torch.randn(2, g * g, 32))
    assert out.shape == (2, 3, bucket, bucket)
    assert out.abs().sum() > 0


def test_each_token_feeds_its_own_cell_of_the_quarter_resolution_map() -> None:
    net = PixelUNet(channels=3, prev_channels=3, model_width=8, patch=16, width=2)
    tokens = torch.zeros(1, 4, 8)  # a 2 x 2 grid; only the top-right token is non-zero
    tokens[0, 1] = 1.0
    with torch.no_grad():
        net.tokens.bias.zero_()
    cells = net.token_map(tokens, 2)  # (1, 8, 8, 8): 4x4 cells
    assert cells.shape == (1, 8, 8, 8)
    nonzero = cells.abs().sum(1)[0] > 0
    assert nonzero[:4, 4:].all() and not nonzero[4:].any() and not nonzero[:, :4].any()


def test_a_bad_unet_width_or_patch_is_refused() -> None:
    with pytest.raises(ValueError, match="unet_width"):
        ModelConfig(unet_width=-1)
    with pytest.raises(ValueError, match="multiple of 4"):
        PixelUNet(3, 3, 32, patch=6, width=4)


def _with_unet(base: WorldModel, width: int = 4) -> WorldModel:
    """``base`` with a convolutional path added at its initial values, loaded as a checkpoint
    from before the path existed is (``training/checkpoint.py``)."""
    cfg = ModelConfig(**{**{f: getattr(base.cfg, f) for f in base.cfg.__dataclass_fields__}, "unet_width": width})
    model = WorldModel(cfg)
    load_state(model, base.state_dict(), "base", allow_missing=("unet.",))
    return model.eval()


def _sample(model: WorldModel, bucket: int = 32, chunks: int = 3) -> torch.Tensor:
    """A few chunks of the serving sampler (``sample_chunk``) with fixed noise, as pixels."""
    cfg = model.cfg
    _, prev, actions, scene = _sequence(model, chunks, bucket, seed=3)
    pool = KVCachePool.create(cfg, bucket, 1, model.rope)
    slot = pool.allocate()
    g = torch.Generator().manual_seed(5)
    noise = [torch.randn(1, 1, cfg.channels, bucket, bucket, generator=g) for _ in range(cfg.denoising_steps)]
    frames = []
    with torch.inference_mode():
        for c in range(chunks):
            ctx = pool.context([slot], np.array([c]))
            inp = model.prepare_chunk(prev[:, c : c + 1], actions[:, c : c + 1], scene, [*cfg.noise_levels(), 0.0])
            pixels, _, k, v = model.sample_chunk(inp, ctx, lambda i: noise[i], torch.float32)
            pool.commit([slot], np.array([[c]]), k, v)
            frames.append(pixels)
    return torch.cat(frames, 1)


def test_a_model_that_gains_the_path_serves_exactly_what_it_served() -> None:
    base = randomized(tiny_config(anchor_warp=True))
    grown = _with_unet(base)
    assert torch.equal(_sample(base), _sample(grown))
    # the path does change the picture once its last convolution has learned anything
    with torch.no_grad():
        grown.unet.out.weight.normal_(0.0, 0.2)
    assert not torch.equal(_sample(base), _sample(grown))


@torch.inference_mode()
def test_the_cached_last_step_equals_the_full_pass_refined_guess() -> None:
    cfg = tiny_config(anchor_warp=True, unet_width=4)
    model = randomized(cfg)
    assert cached_vs_full(model, n_chunks=6, bucket=32) <= 1e-4  # the transformer's path, unchanged
    n, bucket = 5, 32
    x, prev, actions, scene = _sequence(model, n, bucket, seed=2)
    pool = KVCachePool.create(cfg, bucket, 1, model.rope)
    slot = pool.allocate()
    for c in range(n - 1):
        ctx = pool.context([slot], np.array([c]))
        k, v = model.commit_chunk(x[:, c : c + 1], prev[:, c : c + 1], actions[:, c : c + 1], scene, ctx)
        pool.commit([slot], np.array([[c]]), k, v)
    noisy = torch.rand(1, 1, cfg.channels, bucket, bucket, generator=torch.Generator().manual_seed(9)) * 2 - 1
    ctx = pool.context([slot], np.array([n - 1]))
    inp = model.prepare_chunk(prev[:, n - 1 :], actions[:, n - 1 :], scene, [0.25])
    cached = model.final_step(noisy, inp, 0, ctx)
    plain = model.denoise_step(noisy, inp, 0, ctx)
    noise = torch.zeros(1, n)
    noise[:, -1] = 0.25
    flags = torch.zeros(n, dtype=torch.bool)
    flags[-1] = True
    refined: list[torch.Tensor] = []
    full, _ = model.forward_sequence(torch.cat((x[:, :-1], noisy), 1), prev, noise, actions, scene,
                                     torch.arange(n), flags, refined=refined)
    assert refined[0].shape == (1, 1, cfg.channels, bucket, bucket)
    assert (cached - refined[0]).abs().max() <= 1e-4
    assert (plain - full[:, -1:]).abs().max() <= 1e-4
    assert (cached - plain).abs().max() > 1e-3  # the refinement is really there


def test_refined_guesses_need_a_model_with_the_path() -> None:
    model = randomized(tiny_config())
    x, prev, actions, scene = _sequence(model, 2, 32, seed=0)
    with pytest.raises(ValueError, match="unet_width"):
        model.forward_sequence(x, prev, torch.zeros(1, 2), actions, scene, torch.arange(2),
                               torch.tensor([False, True]), refined=[])
