"""The sampler's settings: fresh or kept noise between steps (``sampler_eta``), noised
commits to the cache (``commit_noise``) and the context noise that trains for them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from model.config import ModelConfig
from model.dit import WorldModel, next_noisy
from model.runner import ModelRunner
from model.weights import save_model
from tests.model.conftest import make_runner, randomized, scene_encoder_for, tiny_config
from tests.model.test_runner import rollout
from tests.model.test_train import TINY


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="sampler_eta"):
        tiny_config(sampler_eta=1.5)
    with pytest.raises(ValueError, match="commit_noise"):
        tiny_config(commit_noise=1.0)
    assert tiny_config().noise_draws(4) == 4
    assert tiny_config(commit_noise=0.1).noise_draws(4) == 5


def test_eta_one_puts_fresh_noise_back_and_eta_zero_keeps_the_noise_the_input_holds() -> None:
    g = torch.Generator().manual_seed(0)
    x0, eps, fresh = (torch.randn(2, 1, 3, 8, 8, generator=g) for _ in range(3))
    t, nxt = 0.75, 0.5
    x = (1 - t) * x0 + t * eps
    cfg = tiny_config()
    assert torch.equal(next_noisy(cfg, x, x0, t, nxt, fresh), (1 - nxt) * x0 + nxt * fresh)
    euler = next_noisy(dataclasses.replace(cfg, sampler_eta=0.0), x, x0, t, nxt, fresh)
    assert torch.allclose(euler, (1 - nxt) * x0 + nxt * eps, atol=1e-6)  # the flow's own path
    half = next_noisy(dataclasses.replace(cfg, sampler_eta=0.5), x, x0, t, nxt, fresh)
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


def test_commit_noise_changes_what_the_cache_holds_not_the_chunk_just_made() -> None:
    def frames(level: float, ids: list[str]) -> dict[str, list[np.ndarray]]:
        return rollout(make_runner(tiny_config(commit_noise=level)), ids, chunks=4)

    clean, noised = frames(0.0, ["s"])["s"], frames(0.2, ["s"])["s"]
    assert np.array_equal(clean[0], noised[0])  # its own commit comes after it
    assert all(not np.array_equal(a, b) for a, b in zip(clean[1:], noised[1:], strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(noised, frames(0.2, ["s"])["s"], strict=True))
    together = frames(0.2, ["s", "t"])["s"]  # the commit's noise is the session's own too
    assert max(np.abs(a.astype(int) - b.astype(int)).mean() for a, b in zip(together, noised, strict=True)) < 1.0


def test_a_runner_overrides_only_the_sampler_of_trained_weights(tmp_path: Path) -> None:
    cfg = tiny_config()
    path = save_model(randomized(cfg), tmp_path / "w.safetensors")
    runner = ModelRunner.from_pretrained(path, sampler={"sampler_eta": 0.0, "denoising_steps": 8, "commit_noise": 0.1},
                                         scene_encoder=scene_encoder_for(cfg))
    assert (runner.cfg.sampler_eta, runner.max_steps, runner.cfg.commit_noise) == (0.0, 8, 0.1)
    assert rollout(runner, ["s"], chunks=2, steps=8)["s"][1].shape == (1, 32, 32, 3)
    with pytest.raises(ValueError, match="not sampler settings"):
        ModelRunner.from_pretrained(path, sampler={"width": 64})


def test_context_noise_trains_on_the_context_as_a_noised_cache_holds_it() -> None:
    from model.train import train_step
    from model.train_data import WorldPool

    cfg = ModelConfig(**TINY, commit_noise=0.1)
    model = WorldModel(cfg)
    batch = WorldPool(1, cfg.buckets, np.random.default_rng(0), map_size=256).sequences(2, 5, 64, far=False)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    commits: list[float] = []
    forward, commit = model.forward_sequence, model.commit_chunk

    def spy(x, prev, noise, *a, **kw):  # type: ignore[no-untyped-def]
        seen.append((x.detach().clone(), noise.detach().clone()))
        return forward(x, prev, noise, *a, **kw)

    def commit_spy(x, prev, actions, scene, ctx, level=0.0):  # type: ignore[no-untyped-def]
        commits.append(level)
        return commit(x, prev, actions, scene, ctx, level)

    model.forward_sequence = spy  # type: ignore[method-assign]
    model.commit_chunk = commit_spy  # type: ignore[method-assign]
    loss, _ = train_step(model, batch, cfg, torch.Generator().manual_seed(0), use_rollout=True,
                         context_noise=0.3)
    assert torch.isfinite(loss)
    assert commits and set(commits) == {0.1}  # the self-rollout commits as the server does
    (x, noise), n = seen[0], 5
    ctx_level = noise[:, :n]
    assert (ctx_level[:, 0] == 0).all()  # the sink is an observation: clean
    assert (ctx_level[:, 1:] > 0).all() and (ctx_level < 0.3).all()
    seen.clear()
    train_step(model, batch, cfg, torch.Generator().manual_seed(0), use_rollout=True)
    assert (seen[0][1][:, :n] == 0).all()  # off by default: the context is clean
    clean = seen[0][0][:, :n]  # the same rollout, not noised
    assert torch.equal(clean[:, 0], x[:, 0]) and not torch.equal(clean[:, 1:], x[:, 1:])


def test_an_export_can_choose_the_served_sampler(tmp_path: Path) -> None:
    from model.train import export_checkpoint, train
    from tests.model.test_train import _config

    train(_config(tmp_path, 2, rollout_after=1000), resume=False, export=None)
    path = export_checkpoint(tmp_path, tmp_path / "w", {"sampler_eta": 0})
    runner = ModelRunner.from_pretrained(path)
    assert runner.cfg.sampler_eta == 0.0 and isinstance(runner.cfg.sampler_eta, float)
    assert runner.cfg.width == TINY["width"]  # the trained config otherwise
    with pytest.raises(ValueError, match="not sampler settings"):
        export_checkpoint(tmp_path, tmp_path / "bad", {"depth": 3})
