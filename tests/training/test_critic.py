"""The adversarial term (``training/critic.py``): the critic learns sharp from soft, its term
reaches the model and leaves the critic alone, and it survives a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from worldserve.training.critic import Adversary, FrameCritic
from worldserve.training.train import TrainConfig, adv_ramp, train

TINY = dict(width=48, depth=2, heads=2, time_rope_dims=8, window_frames=2, sink_frames=1)


def _frames(n: int, size: int, seed: int) -> torch.Tensor:
    """Sharp frames: random blocky textures in [-1, 1], (1, n, 3, size, size)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, size // 4, size // 4, generator=g) * 2 - 1
    return F.interpolate(coarse, scale_factor=4, mode="nearest")[None]


def test_the_critic_learns_sharp_frames_from_their_blurred_average() -> None:
    torch.manual_seed(0)
    adv = Adversary(3, 5, lr=1e-3, frames=16)
    g = torch.Generator().manual_seed(0)
    scene = torch.zeros(1, 16, 5)
    gaps = []
    for step in range(30):
        real = _frames(16, 32, step)
        soft = F.avg_pool2d(real[0], 5, 1, 2)[None]  # what a regressor that averages draws
        adv.generator_loss(soft, real, scene, g)
        gaps.append(float(adv.critic_step()["critic_gap"]))
    assert abs(gaps[0]) < 0.05 and np.mean(gaps[-10:]) > 0.5  # from chance to a clear margin
    real, soft = _frames(16, 32, 999), F.avg_pool2d(_frames(16, 32, 999)[0], 5, 1, 2)[None]
    with torch.no_grad():  # held-out frames: sharp scores above soft
        assert adv.critic(real[0], scene[0]).mean() > adv.critic(soft[0], scene[0]).mean()


def test_the_model_term_reaches_the_guess_and_not_the_critic() -> None:
    adv = Adversary(3, 5, frames=4)
    g = torch.Generator().manual_seed(0)
    pred = _frames(6, 16, 1).requires_grad_(True)
    loss = adv.generator_loss(pred, _frames(6, 16, 2), torch.zeros(1, 6, 5), g)
    loss.backward()
    assert pred.grad is not None and pred.grad.abs().sum() > 0
    assert (pred.grad.abs().sum(dim=(2, 3, 4)) > 0).sum() == 4  # only the sampled frames
    assert all(p.grad is None for p in adv.critic.parameters())
    before = [p.detach().clone() for p in adv.critic.parameters()]
    adv.critic_step()
    assert any(not torch.equal(a, p) for a, p in zip(before, adv.critic.parameters(), strict=True))
    with pytest.raises(RuntimeError, match="generator_loss first"):
        adv.critic_step()


def test_the_critic_judges_every_bucket_with_the_scene() -> None:
    critic = FrameCritic(3, 5)
    x64, x128 = torch.zeros(2, 3, 64, 64), torch.zeros(2, 3, 128, 128)
    assert critic(x64, torch.zeros(2, 5)).shape == (2, 8, 8)
    assert critic(x128, torch.zeros(2, 5)).shape == (2, 16, 16)
    with torch.no_grad():
        a = critic(_frames(2, 64, 0)[0], torch.zeros(2, 5))
        b = critic(_frames(2, 64, 0)[0], torch.eye(5)[:2])
    assert not torch.allclose(a, b)  # the scene has its say


def test_the_term_ramps_in_after_the_critic_warms_up() -> None:
    tc = TrainConfig(adv_warmup=100)
    assert [adv_ramp(s, tc) for s in (0, 100, 150, 200, 5000)] == [0.0, 0.0, 0.5, 1.0, 1.0]
    assert adv_ramp(0, TrainConfig(adv_warmup=0)) == 1.0


def test_training_with_the_critic_resumes_it_and_exports_only_the_model(tmp_path: Path) -> None:
    def cfg(steps: int) -> TrainConfig:
        return TrainConfig(
            out=str(tmp_path), minutes=10, max_steps=steps, batch=4, seq_frames=5, big_bucket_every=5,
            lr=3e-3, warmup=3, self_rollout_after=0, self_rollout_share=0.5, worlds=2,
            world_refresh=1000, map_size=256, checkpoint_minutes=60, model=TINY,
            adv_weight=0.05, adv_warmup=2,
        )

    report = train(cfg(6), resume=False, export=None)
    assert np.isfinite(report["loss_last_10_this_run"])
    saved = load_file(str(tmp_path / "ckpt.safetensors"))
    critic_keys = [k for k in saved if k.startswith("critic.")]
    assert critic_keys and any(k.startswith("copt.") for k in saved)

    resumed = Adversary(3, json.loads((tmp_path / "ckpt.json").read_text())["model"]["scene_dim"])
    assert resumed.load(saved)
    for k, v in resumed.critic.state_dict().items():
        assert torch.equal(v, saved[f"critic.{k}"])
    assert next(iter(resumed.opt.state.values()))["exp_avg"].abs().sum() > 0

    train(cfg(8), resume=True, export=tmp_path / "w")
    exported = load_file(str(tmp_path / "w.safetensors"))
    assert not any(k.startswith(("critic.", "copt.")) for k in exported)


def test_the_model_term_moves_only_the_pixels_it_may_reach() -> None:
    adv = Adversary(3, 5, frames=6)
    g = torch.Generator().manual_seed(0)
    pred = _frames(6, 16, 1).requires_grad_(True)
    reach = torch.zeros(1, 6, 1, 16, 16)
    reach[..., :, 12:] = 1.0  # say, the strip the camera just brought into view
    plain = adv.critic(pred[0].detach(), torch.zeros(6, 5)).mean()
    loss = adv.generator_loss(pred, _frames(6, 16, 2), torch.zeros(1, 6, 5), g, reach)
    assert torch.allclose(loss, -plain, atol=1e-3)  # the critic judges the whole guess all the same (its
    # spectral norms take one more power-iteration step per call, hence the tolerance)
    loss.backward()
    assert pred.grad is not None
    assert pred.grad[..., :12].abs().sum() == 0 and pred.grad[..., 12:].abs().sum() > 0
