"""The second motion layer: a kernel free of the action and a per-pixel mix of the two moves."""

from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig
from model.dit import WorldModel
from model.weights import load_state
from tests.model.conftest import randomized, tiny_config


def _inputs(cfg: ModelConfig, n: int = 4, bucket: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1, n, cfg.channels, bucket, bucket, generator=g) * 2 - 1
    prev = torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), 1)
    return (x, prev, torch.rand(1, n, generator=g), torch.rand(1, n, cfg.action_dim, generator=g),
            torch.rand(1, cfg.scene_dim, generator=g), torch.arange(n), torch.zeros(n, dtype=torch.bool))


def test_motion_layers_must_be_one_or_two() -> None:
    with pytest.raises(ValueError, match="motion_layers must be 1 or 2, got 3"):
        tiny_config(motion_layers=3)


def test_a_one_layer_model_loads_into_two_layers_and_starts_close_to_it() -> None:
    one = randomized(tiny_config())
    two = WorldModel(tiny_config(motion_layers=2)).eval()
    load_state(two, one.state_dict(), "one-layer weights", allow_missing=("drift_heads.",))
    with torch.no_grad():
        a, _ = one.forward_sequence(*_inputs(one.cfg))
        b, _ = two.forward_sequence(*_inputs(two.cfg))
        # the mix starts at sigmoid(2): 88% of each pixel from the camera-moved frame
        assert 0 < (a - b).abs().mean() < 0.15 * a.abs().mean()


def test_the_mix_chooses_per_pixel_between_the_two_moved_frames() -> None:
    cfg = tiny_config(motion_layers=2)
    model = randomized(cfg)
    taps = 2 * cfg.radius(32) + 1
    head = model.drift_heads["b32"]
    kernels: list[torch.Tensor] = []
    with torch.no_grad():
        head.weight[2 * taps :] = 0.0
        head.bias[2 * taps :] = 30.0  # every pixel from the camera-moved frame
        cam, _ = model.forward_sequence(*_inputs(cfg), kernels=kernels)
        head.bias[2 * taps :] = -30.0  # every pixel from the second layer
        own, _ = model.forward_sequence(*_inputs(cfg))
    assert len(kernels) == 2 and kernels[1].shape == kernels[0].shape
    assert (cam - own).abs().max() > 0.05  # the two layers move the frame differently
