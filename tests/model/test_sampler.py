"""The sampler's settings: fresh or kept noise between steps (``sampler_eta``), what a runner
may override on trained weights, and configs written while the removed trials had switches."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.model.conftest import make_runner, randomized, scene_encoder_for, tiny_config
from tests.model.test_runner import rollout
from tests.training.test_train import TINY
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.net.flow import next_noisy
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import save_model


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="sampler_eta"):
        tiny_config(sampler_eta=1.5)


def test_a_config_written_before_the_trials_left_loads_and_one_that_uses_them_is_refused() -> None:
    old = json.loads(ModelConfig().to_json())
    old.update(renoise=1.0, commit_noise=0.0, motion_layers=1, refine_channels=0)  # as they were shipped, off
    assert ModelConfig.from_dict(old) == ModelConfig()
    for name, on in (("recall_patch", 4), ("canvas_memory", True), ("motion_layers", 2), ("renoise", 0.5)):
        with pytest.raises(ValueError, match=f"{name}=.*removed"):
            ModelConfig.from_dict({**old, name: on})
    with pytest.raises(ValueError, match="unknown config fields"):
        ModelConfig.from_dict({**old, "no_such_field": 1})


def test_eta_one_puts_fresh_noise_back_and_eta_zero_keeps_the_noise_the_input_holds() -> None:
    g = torch.Generator().manual_seed(0)
    x0, eps, fresh = (torch.randn(2, 1, 3, 8, 8, generator=g) for _ in range(3))
    t, nxt = 0.75, 0.5
    x = (1 - t) * x0 + t * eps
    assert torch.equal(next_noisy(x, x0, t, nxt, fresh, 1.0), (1 - nxt) * x0 + nxt * fresh)
    euler = next_noisy(x, x0, t, nxt, fresh, 0.0)
    assert torch.allclose(euler, (1 - nxt) * x0 + nxt * eps, atol=1e-6)  # the flow's own path
    half = next_noisy(x, x0, t, nxt, fresh, 0.5)
    noise = (half - (1 - nxt) * x0) / nxt
    assert torch.allclose(noise, 0.75**0.5 * eps + 0.5 * fresh, atol=1e-5)  # still unit variance


def test_the_euler_sampler_is_deterministic_given_the_first_noise_only() -> None:
    """eta 0: the steps after the first put no fresh noise back, so the frames differ from
    the default sampler's but are the same for every run of the session."""
    def frames(eta: float) -> list[np.ndarray]:
        runner = make_runner()
        runner.model.cfg = dataclasses.replace(runner.cfg, sampler_eta=eta)
        return rollout(runner, ["s"], chunks=3)["s"]

    euler = frames(0.0)
    assert all(np.array_equal(a, b) for a, b in zip(euler, frames(0.0), strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(euler, frames(1.0), strict=True))


def test_a_runner_overrides_only_the_sampler_of_trained_weights(tmp_path: Path) -> None:
    cfg = tiny_config()
    path = save_model(randomized(cfg), tmp_path / "w.safetensors")
    runner = ModelRunner.from_pretrained(path, sampler={"sampler_eta": 1.0, "denoising_steps": 8},
                                         scene_encoder=scene_encoder_for(cfg))
    assert (runner.cfg.sampler_eta, runner.max_steps) == (1.0, 8)
    assert rollout(runner, ["s"], chunks=2, steps=8)["s"][1].shape == (1, 32, 32, 3)
    for bad in ({"width": 64}, {"commit_noise": 0.1}):
        with pytest.raises(ValueError, match="not sampler settings"):
            ModelRunner.from_pretrained(path, sampler=bad)


def test_training_rolls_out_with_fresh_noise_and_trains_on_a_clean_context() -> None:
    """The self-rollout samples as the shipped weights were trained (eta 1, whatever the
    served ``sampler_eta``) and commits clean frames; the trained context is clean."""
    from worldserve.training.data import WorldPool
    from worldserve.training.train import ROLLOUT_ETA, train_step

    cfg = ModelConfig(**TINY)
    model = WorldModel(cfg)
    batch = WorldPool(1, cfg.buckets, np.random.default_rng(0), map_size=256).sequences(2, 5, 64, far=False)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    forward = model.forward_sequence

    def spy(x, prev, noise, *a, **kw):  # type: ignore[no-untyped-def]
        seen.append((x.detach().clone(), noise.detach().clone()))
        return forward(x, prev, noise, *a, **kw)

    model.forward_sequence = spy  # type: ignore[method-assign]
    loss, _ = train_step(model, batch, cfg, torch.Generator().manual_seed(0), use_rollout=True)
    assert torch.isfinite(loss) and ROLLOUT_ETA == 1.0
    (x, noise), n = seen[0], 5
    assert (noise[:, :n] == 0).all()  # the context half: clean
    assert not torch.equal(x[:, 1:n], x[:, n + 1 :])  # the rollout, not the noisy targets


def test_an_export_can_choose_the_served_sampler(tmp_path: Path) -> None:
    from tests.training.test_train import _config
    from worldserve.training.train import export_checkpoint, train

    train(_config(tmp_path, 2, rollout_after=1000), resume=False, export=None)
    path = export_checkpoint(tmp_path, tmp_path / "w", {"sampler_eta": 1})
    runner = ModelRunner.from_pretrained(path)
    assert runner.cfg.sampler_eta == 1.0 and isinstance(runner.cfg.sampler_eta, float)
    assert runner.cfg.width == TINY["width"]  # the trained config otherwise
    with pytest.raises(ValueError, match="not sampler settings"):
        export_checkpoint(tmp_path, tmp_path / "bad", {"depth": 3})
